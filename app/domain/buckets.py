"""Which M values to tune so every captured M hits a row. AITER's GEMM lookups try M, then
getPaddedM(M,N,K,0), then getPaddedM(M,N,K,1); a row at a bucket value serves every M whose tries reach it."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.domain.families import TableFamily
from app.domain.keys import m_candidates


@dataclass
class BucketRow:
    rest: tuple[tuple[str, str], ...]  # the shape without M
    m: int
    covers: list[int] = field(default_factory=list)  # captured Ms this row serves
    served: float = 0.0

    def shape(self, m_column: str) -> dict[str, str]:
        return dict(self.rest, **{m_column: str(self.m)})


def plan(family: TableFamily, shapes: list[tuple[dict[str, str], float]]) -> list[BucketRow]:
    """Greedy cover, heaviest served time first: each pick is the M value reached by the most uncovered
    served time among the lookups of one (N, K, flags) group. shapes: (shape, served time)."""
    mcol = family.m_column
    if mcol is None:
        return [BucketRow(tuple(s.items()), 0, [], w) for s, w in shapes]
    groups: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
    for s, w in shapes:
        rest = tuple((k, v) for k, v in s.items() if k != mcol)
        g = groups.setdefault(rest, {})
        g[int(s[mcol])] = g.get(int(s[mcol]), 0.0) + w
    out: list[BucketRow] = []
    for rest, ms in groups.items():
        tries = {m: m_candidates(family, dict(rest, **{mcol: str(m)})) for m in ms}
        left = dict(ms)
        while left:
            reach: dict[int, float] = {}
            for m, w in left.items():
                for cand in tries[m]:
                    reach[cand] = reach.get(cand, 0.0) + w
            best = max(reach, key=lambda c: (reach[c], -c))
            covered = sorted(m for m in left if best in tries[m])
            out.append(BucketRow(rest, best, covered, sum(left[m] for m in covered)))
            for m in covered:
                del left[m]
    return sorted(out, key=lambda r: -r.served)
