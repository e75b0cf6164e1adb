"""The flat view of a family's rules: every sub-record field read as `family.<field>`, as every caller read it
before the rules were grouped (issue 36). Read-only: a family is changed by replacing its sub-record
(dataclasses.replace(family, lookup=replace(family.lookup, ...)), as releases.py does)."""

from __future__ import annotations

from app.domain.families.log_formats import LogLine
from app.domain.families.moe_paths import MoeOpPath
from app.domain.families.ops import MissRaises, OpEntry, OpPath, OpRemap, ReadCell, RowUse, WeightRetry
from app.domain.families.rules import (CaptureRules, CppPadding, DeployRules, DuplicateKeys, FlydslMiss, GfxSource,
                                       KeyMatch, LoaderRules, LookupRules, Math, OpDispatch, Padding, ReplaySpec,
                                       TunerRules)


class FlatRules:
    """Mixed into TableFamily: each property reads the sub-record that holds the field."""
    lookup: LookupRules
    loader: LoaderRules
    op: OpDispatch
    deploy: DeployRules
    tuner: TunerRules
    capture: CaptureRules

    # --- LookupRules
    @property
    def padding(self) -> Padding:
        return self.lookup.padding

    @property
    def gfx_source(self) -> GfxSource:
        return self.lookup.gfx_source

    @property
    def gfx_on_miss(self) -> bool:
        return self.lookup.gfx_on_miss

    @property
    def miss_raises(self) -> tuple[MissRaises, ...]:
        return self.lookup.miss_raises

    @property
    def lookup_ignores(self) -> tuple[str, ...]:
        return self.lookup.lookup_ignores

    @property
    def key_match(self) -> KeyMatch:
        return self.lookup.key_match

    @property
    def lookup_derived(self) -> tuple[tuple[str, str, int], ...]:
        return self.lookup.lookup_derived

    @property
    def flydsl_miss(self) -> FlydslMiss:
        return self.lookup.flydsl_miss

    @property
    def flydsl_catalog(self) -> str | None:
        return self.lookup.flydsl_catalog

    @property
    def compiled(self) -> bool:
        return self.lookup.compiled

    @property
    def cpp_key(self) -> tuple[str, ...] | None:
        return self.lookup.cpp_key

    @property
    def cpp_padding(self) -> CppPadding:
        return self.lookup.cpp_padding

    @property
    def cpp_libtype(self) -> str | None:
        return self.lookup.cpp_libtype

    @property
    def aiter_lookup(self) -> str | None:
        return self.lookup.aiter_lookup

    @property
    def aiter_file_attr(self) -> str | None:
        return self.lookup.aiter_file_attr

    @property
    def aiter_args(self) -> tuple[str, ...]:
        return self.lookup.aiter_args


    # --- LoaderRules
    @property
    def duplicate_keys(self) -> DuplicateKeys:
        return self.loader.duplicate_keys

    @property
    def backfill_gfx(self) -> bool:
        return self.loader.backfill_gfx

    @property
    def gfx_optional(self) -> bool:
        return self.loader.gfx_optional

    @property
    def dropped_rows(self) -> tuple[tuple[str, str], ...]:
        return self.loader.dropped_rows

    @property
    def env_concat(self) -> bool:
        return self.loader.env_concat

    @property
    def comment_prefix(self) -> str | None:
        return self.loader.comment_prefix

    @property
    def loader_ints(self) -> tuple[tuple[str, bool], ...]:
        return self.loader.loader_ints

    @property
    def tuned_variants(self) -> tuple[tuple[str, str], ...]:
        return self.loader.tuned_variants

    @property
    def untuned_variants(self) -> tuple[str, ...]:
        return self.loader.untuned_variants


    # --- OpDispatch
    @property
    def remaps(self) -> tuple[tuple[str, str, str], ...]:
        return self.op.remaps

    @property
    def op_remaps(self) -> tuple[OpRemap, ...]:
        return self.op.op_remaps

    @property
    def op_entries(self) -> tuple[OpEntry, ...]:
        return self.op.op_entries

    @property
    def op_paths(self) -> tuple[OpPath, ...]:
        return self.op.op_paths

    @property
    def aiter_op(self) -> str | None:
        return self.op.aiter_op

    @property
    def libtype_use(self) -> tuple[tuple[str, RowUse], ...]:
        return self.op.libtype_use

    @property
    def libtype_other(self) -> RowUse:
        return self.op.libtype_other

    @property
    def libtype_use_unless(self) -> tuple[tuple[str, str], ...]:
        return self.op.libtype_use_unless

    @property
    def read_cells(self) -> tuple[ReadCell, ...]:
        return self.op.read_cells

    @property
    def moe_op(self) -> MoeOpPath | None:
        return self.op.moe_op

    @property
    def op_sources(self) -> tuple[str, ...]:
        return self.op.op_sources

    @property
    def weight_retry(self) -> WeightRetry | None:
        return self.op.weight_retry


    # --- DeployRules
    @property
    def filled(self) -> tuple[str, ...]:
        return self.deploy.filled

    @property
    def filled_unless(self) -> tuple[tuple[str, str, str], ...]:
        return self.deploy.filled_unless

    @property
    def overlay_first(self) -> bool:
        return self.deploy.overlay_first

    @property
    def deploy_notes(self) -> tuple[str, ...]:
        return self.deploy.deploy_notes

    @property
    def served_as(self) -> tuple[tuple[str, str], ...]:
        return self.deploy.served_as


    # --- TunerRules
    @property
    def tuner_script(self) -> str | None:
        return self.tuner.tuner_script

    @property
    def catalog_lists(self) -> tuple[tuple[str, str], ...]:
        return self.tuner.catalog_lists

    @property
    def tuner_args(self) -> tuple[str, ...]:
        return self.tuner.tuner_args

    @property
    def tuner_races(self) -> bool:
        return self.tuner.tuner_races

    @property
    def math(self) -> Math:
        return self.tuner.math

    @property
    def replay(self) -> ReplaySpec | None:
        return self.tuner.replay

    @property
    def err_max(self) -> float:
        return self.tuner.err_max


    # --- CaptureRules
    @property
    def shape_defaults(self) -> tuple[tuple[str, str], ...]:
        return self.capture.shape_defaults

    @property
    def dim_bounds(self) -> tuple[tuple[str, int, int], ...]:
        return self.capture.dim_bounds

    @property
    def sentinels(self) -> tuple[tuple[str, str], ...]:
        return self.capture.sentinels

    @property
    def log_lines(self) -> tuple[LogLine, ...]:
        return self.capture.log_lines
