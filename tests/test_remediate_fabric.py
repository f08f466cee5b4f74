"""The fabric gate: a rebooted or reset node returns only once its NVLink fabric is complete, as its
exporter reports it (every GPU's fabric state completed and healthy, every NVSwitch on the PCI bus);
one whose fabric is not complete within fabric_wait is held. Read from an exporter-shaped endpoint
whose answer the test changes, through the worker and the generic command adapter."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from gpunode_common.config import ConfigError
from gpunode_remediate import health
from gpunode_remediate import policy as policies
from gpunode_remediate.cli import status_text
from gpunode_remediate.health import fabric_trouble
from gpunode_remediate.state import State
from tests.helpers import free_port, serve_text
from tests.remediation import alert_json
from tests.test_remediate_engine import Clock, calls, cluster, deliver, engine  # noqa: F401

GPUS = 8


def exposition(states: dict[int, int] | None = None, unhealthy: tuple[int, ...] = (), switches: int | None = 4,
               expected_switches: int | None = 4, fabric: bool = True) -> str:
    """An 8-GPU node's exporter answer: every GPU's fabric completed and healthy unless said."""
    states = states or {}
    lines = [f"gpunode_gpus_expected {GPUS}", f'gpunode_gpus_visible{{source="nvml"}} {GPUS}']
    for gpu in range(GPUS):
        uuid = f"GPU-{gpu:08x}-0000-0000-0000-000000000000"
        lines.append(f'gpunode_gpu_up{{gpu="{gpu}",uuid="{uuid}"}} 1')
        if fabric:
            lines.append(f'gpunode_gpu_fabric_state{{gpu="{gpu}",uuid="{uuid}"}} {states.get(gpu, 3)}')
            lines.append(f'gpunode_gpu_fabric_healthy{{gpu="{gpu}",uuid="{uuid}"}} {int(gpu not in unhealthy)}')
    if expected_switches is not None:
        lines.append(f"gpunode_nvswitches_expected {expected_switches}")
    if switches is not None:
        lines.append(f'gpunode_nvswitches_visible{{source="pci"}} {switches}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("text", "trouble"), [
    (exposition(), None),
    (exposition(fabric=False, switches=None, expected_switches=None), None),  # no NVSwitch: no fabric
    (exposition({0: 2, 1: 2, 5: 1}), "GPU 5 fabric not started; GPU 0,1 fabric in progress"),
    (exposition({6: 0}), "GPU 6 fabric state 0"),
    (exposition({g: 2 for g in range(GPUS)}), "GPU 0,1,2,3,4,5,6,7 fabric in progress"),
    (exposition(unhealthy=(3,)), "GPU 3 fabric unhealthy"),
    (exposition({3: 2, 4: 1}, unhealthy=(3, 4, 5)), "GPU 4 fabric not started; GPU 3 fabric in progress; "
     "GPU 5 fabric unhealthy"),  # as the exporter says it: healthy 0 until completed
    (exposition(switches=3), "3 of 4 NVSwitches on the PCI bus"),
    (exposition({2: 2}, unhealthy=(7,), switches=3),
     "GPU 2 fabric in progress; GPU 7 fabric unhealthy; 3 of 4 NVSwitches on the PCI bus"),
    (exposition(switches=None), None),  # the bus not readable: nothing to compare
    (exposition(expected_switches=None, switches=2), None),  # no expected count configured
    ('gpunode_gpu_fabric_state{gpu="1",uuid="x"} NaN\n', None),
    ('gpunode_gpu_fabric_state_other{gpu="1"} 1\n', None),
    ('gpunode_gpu_fabric_state{gpu="10",uuid="a"} 1\ngpunode_gpu_fabric_state{gpu="9",uuid="b"} 1\n',
     "GPU 9,10 fabric not started"),
], ids=lambda v: "" if v is None or "\n" in v else v)
def test_what_keeps_the_fabric_from_complete(text: str, trouble: str | None) -> None:
    assert fabric_trouble(text) == trouble


def test_fabric_wait_is_a_policy_duration() -> None:
    assert policies.build({}).fabric_wait == 600.0
    assert policies.build({"fabric_wait": "90s"}).fabric_wait == 90.0
    for wrong in ("soon", -1, True, [1]):
        with pytest.raises(ConfigError, match=r"^key 'fabric_wait': want a duration"):
            policies.build({"fabric_wait": wrong})


class Exporter:
    """An endpoint serving `text` as an exporter serves its metrics; `up` False: connection refused."""

    def __init__(self) -> None:
        self.text = exposition()
        self.asked: list[str] = []
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.url = f"http://127.0.0.1:{self.port}/metrics?node={{node}}"

    def _answer(self, path: str) -> str:
        self.asked.append(path)
        return self.text

    @property
    def up(self) -> bool:
        return self.server is not None

    @up.setter
    def up(self, value: bool) -> None:
        if value and self.server is None:
            self.server = serve_text(self._answer, port=self.port)
        elif not value and self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    e.up = True
    yield e
    e.up = False


def test_the_check_answers_bounded_for_the_fabric_and_an_exporter_that_does_not_answer(exporter: Exporter) -> None:
    policy = policies.build({"health_check": {"url": exporter.url, "timeout": "2s"}})
    assert health.check("gpu001", policy) is None
    assert exporter.asked == ["/metrics?node=gpu001"]
    exporter.text = exposition({4: 1})
    assert health.check("gpu001", policy) == health.Trouble("fabric not complete: GPU 4 fabric not started", True)
    exporter.text = exposition({4: 1}).replace(f'gpunode_gpus_visible{{source="nvml"}} {GPUS}',
                                               'gpunode_gpus_visible{source="nvml"} 7')
    assert health.check("gpu001", policy) == health.Trouble("its exporter sees 7 of 8 GPUs", False)
    exporter.up = False
    trouble = health.check("gpu001", policy)
    assert trouble is not None and trouble.bounded
    assert trouble.why.startswith(f"its exporter at http://127.0.0.1:{exporter.port}/metrics?node=gpu001 does not "
                                  "answer")


def fabric_not_ready(node: str, clock: Clock, status: str = "firing", **times: float) -> dict:
    return alert_json("GpuFabricNotReady", node, status, cause="in_progress", gpu="0", **times)


def rebooted(e: object, node: str, clock: Clock) -> None:
    """GpuFabricNotReady: rebooted (the command adapter's reboot leaves the node down), resolved, and
    quiet for the quiet period: the next pass would return it."""
    starts = clock.now - 300
    deliver(e, fabric_not_ready(node, clock, starts=starts), clock=clock)
    e.reconcile()
    assert e.state.records()[node].phase == "rebooted"
    deliver(e, fabric_not_ready(node, clock, "resolved", starts=starts, ends=clock.now), clock=clock)
    clock.now += 901


def test_a_rebooted_node_returns_only_once_its_fabric_completes(tmp_path: Path, cluster: Path,  # noqa: F811
                                                                exporter: Exporter) -> None:
    clock = Clock()
    e = engine(tmp_path, cluster, clock, health_check={"url": exporter.url, "timeout": "2s"})
    rebooted(e, "gpu003", clock)
    assert calls(cluster) == ["reboot gpu003 gpunode: reboot GpuFabricNotReady cause=in_progress gpu=0"]
    exporter.text = exposition({g: 2 for g in range(GPUS)})
    for _ in range(3):
        e.reconcile()
        clock.now += 60
    assert len(calls(cluster)) == 1 and e.state.records()["gpu003"].phase == "rebooted"
    note = e.state.notes()["gpu003"][0]
    assert note.startswith("not returned: fabric not complete: GPU 0,1,2,3,4,5,6,7 fabric in progress (held at ")
    assert note.endswith("if it lasts: fabric_wait 10 min)")
    status = status_text(e.policy, e.state, clock.now)
    assert "gpu003  rebooted" in status and "its NVLink fabric is complete (held after fabric_wait)" in status
    assert "fabric in progress (held at " in status
    exporter.text = exposition()
    e.reconcile()
    assert calls(cluster)[1:] == ["resume gpu003"]
    assert "gpu003" not in e.state.records() and "gpu003" not in e.state.notes()
    assert e.state.db.execute("SELECT COUNT(*) FROM return_waits").fetchone()[0] == 0


def test_a_fabric_that_never_completes_holds_the_node_after_fabric_wait_across_a_restart(
        tmp_path: Path, cluster: Path, exporter: Exporter) -> None:  # noqa: F811
    clock = Clock()
    policy = {"health_check": {"url": exporter.url, "timeout": "2s"}, "fabric_wait": "5m",
              "validate_command": ["false"]}  # never run: the fabric holds the node first
    e = engine(tmp_path, cluster, clock, **policy)
    rebooted(e, "gpu004", clock)
    exporter.text = exposition({1: 2}, switches=3)
    e.reconcile()
    clock.now += 200
    e.reconcile()
    assert len(calls(cluster)) == 1
    e.state.close()
    clock.now += 99  # 299 s waited: the restart does not start the wait again
    again = engine(tmp_path, cluster, clock, **policy)
    again.reconcile()
    assert len(calls(cluster)) == 1
    clock.now += 1
    again.reconcile()
    why = "fabric not complete: GPU 1 fabric in progress; 3 of 4 NVSwitches on the PCI bus"
    assert calls(cluster)[1:] == [f"drain gpu004 gpunode: hold {why}"]
    record = again.state.records()["gpu004"]
    assert (record.phase, record.why) == ("held", why)
    status = status_text(again.policy, State(again.policy.state_path, readonly=True), clock.now)
    assert "gpu004  held  since " in status and f"hold gpu 0: {why}; next: waits for a person" in status
    exporter.text = exposition()
    clock.now += 3600
    again.reconcile()
    assert len(calls(cluster)) == 2  # held: never returned by the service


def test_an_exporter_that_does_not_answer_holds_the_node_after_fabric_wait(
        tmp_path: Path, cluster: Path, exporter: Exporter) -> None:  # noqa: F811
    clock = Clock()
    e = engine(tmp_path, cluster, clock, health_check={"url": exporter.url, "timeout": "2s"})
    rebooted(e, "gpu005", clock)
    exporter.up = False
    e.reconcile()
    assert e.state.notes()["gpu005"][0].startswith(f"not returned: its exporter at http://127.0.0.1:{exporter.port}")
    clock.now += 599
    e.reconcile()
    assert len(calls(cluster)) == 1
    clock.now += 1
    e.reconcile()
    assert calls(cluster)[-1].startswith(f"drain gpu005 gpunode: hold its exporter at http://127.0.0.1:{exporter.port}"
                                         "/metrics?node=gpu005 does not answer")


def test_a_node_without_fabric_metrics_returns_and_a_short_gpu_count_still_waits_unbounded(
        tmp_path: Path, cluster: Path, exporter: Exporter) -> None:  # noqa: F811
    clock = Clock()
    e = engine(tmp_path, cluster, clock, health_check={"url": exporter.url, "timeout": "2s"}, fabric_wait="1m")
    rebooted(e, "gpu006", clock)
    exporter.text = exposition().replace(f'gpunode_gpus_visible{{source="nvml"}} {GPUS}',
                                         'gpunode_gpus_visible{source="nvml"} 7')
    e.reconcile()
    clock.now += 3600
    e.reconcile()
    assert len(calls(cluster)) == 1 and e.state.notes()["gpu006"][0] == "not returned: its exporter sees 7 of 8 GPUs"
    exporter.text = exposition(fabric=False, switches=None, expected_switches=None)  # a PCIe node: no fabric
    e.reconcile()
    assert calls(cluster)[1:] == ["resume gpu006"]
