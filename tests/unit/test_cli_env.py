"""The CLI's environment: a malformed value is an error naming it, only in the command that reads it; the
capture agent's own name (TUNER_HOSTNAME) is not the service's listen address (TUNER_HOST); its retries are
jittered."""

from __future__ import annotations

import argparse
import random
import threading

import pytest

from app import cli
from app.capture import agent


def test_a_malformed_cu_num_fails_only_the_capture_command_and_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CU_NUM", "304x")
    with pytest.raises(SystemExit) as e:
        cli.main(["token", "--help"])  # another subcommand's parser is built and used: no error
    assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        cli.main(["capture", "--once", "--service", "http://127.0.0.1:1", "--image-digest", "x", "--log", "-"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "TUNER_CU_NUM" in err and "'304x'" in err, err


def _capture_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    agent.add_arguments(p)
    return p.parse_args(argv)


def test_the_capture_agent_reads_its_name_from_tuner_hostname_not_the_listen_address(monkeypatch):
    monkeypatch.setenv("TUNER_HOST", "0.0.0.0")  # the service's listen address
    monkeypatch.setenv("TUNER_HOSTNAME", "node-3")
    monkeypatch.setenv("TUNER_CU_NUM", "304")
    args = _capture_args([])
    assert args.host == "node-3" and args.cu_num == 304
    monkeypatch.delenv("TUNER_HOSTNAME")
    assert _capture_args([]).host != "0.0.0.0"


def test_example_capture_for_a_cpu_reports_the_cpu_worker_count_not_nproc(monkeypatch):
    from workers.identity import cpu_count
    sent = {}

    class Reply:
        status_code, is_success = 201, True

        def __init__(self, body):
            self.body = body

        def json(self):
            return self.body

    monkeypatch.setattr(cli, "_wait_up", lambda url, timeout_s: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what `nproc` would print
    import httpx
    monkeypatch.setattr(httpx, "post", lambda url, json, **kw: sent.update(json) or Reply({}))
    monkeypatch.setattr(httpx, "get", lambda url, **kw: Reply([]))
    assert cli.main(["example-capture", "--gfx", "cpu", "--token", "t"]) == 0
    assert sent["gfx"] == "cpu" and sent["cu_num"] == cpu_count()


class Down:
    """An agent whose service never answers; collect reads nothing."""

    def __init__(self):
        self.args = argparse.Namespace(interval_s=10.0)

    def collect(self, **kw):
        return 0

    def deliver(self):
        return False


class Waits(threading.Event):
    def __init__(self, n: int):
        super().__init__()
        self.n, self.seen = n, []

    def wait(self, timeout=None):
        self.seen.append(timeout)
        if len(self.seen) == self.n:
            self.set()
        return self.is_set()


def test_the_follow_loop_backs_off_with_jitter_so_sidecars_do_not_retry_in_lockstep(monkeypatch):
    runs = []
    for seed in (1, 2):
        monkeypatch.setattr(agent, "_RNG", random.Random(seed))
        stop = Waits(8)
        assert agent._follow(Down(), stop) == 0  # type: ignore[arg-type]
        runs.append(stop.seen)
    for waits in runs:
        ceilings = [min(10.0 * 2 ** (i + 1), 300.0) for i in range(len(waits))]
        assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings)), (waits, ceilings)
    assert runs[0] != runs[1]  # two agents that lost the service together come back at different times
    assert len({w for w in runs[0][-3:]}) == 3  # capped at 300 s, still spread
