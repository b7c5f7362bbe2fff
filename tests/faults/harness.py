"""Runs a real cluster under a fault schedule and checks what survived.

One asyncio loop drives everything: the fault proxy (all peer links go through it), the node
processes (laminar.client.localcluster), the client worker processes (tests/faults/worker.py)
and the final read-back. Nothing here blocks the loop for long, since a blocked loop would
stall the proxy and look like a partition.

    run = FaultRun(RunConfig(root, nodes=3, seed=7, faults=["kill_one", "pause"], cycles=4))
    report = await run.execute()      # start, cycles, heal, read back, check, stop
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from laminar.client import Admin, Consumer
from laminar.client.decoding import decode_consumer_records
from laminar.client.localcluster import LocalCluster, _die_with_parent, free_port_pairs
from laminar.client.types import ConsumerRecord, TopicPartition
from laminar.errors import LaminarError, NotLeaderError
from laminar.segment.batch import is_control, iter_batches, verify_batch
from laminar.segment.fileio import POWERLOSS_JOURNAL_ENV
from laminar.transport import split_address
from tests.faults.checker import Verdict, check, read_history
from tests.faults.corruption import corrupt, has_sealed_segment
from tests.faults.powerloss import lose_power
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import Cycle, Fault, make_schedule

TOPIC = "faults"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunConfig:
    root: Path
    nodes: int = 3
    seed: int = 1
    faults: list[str] = field(default_factory=lambda: ["kill_one"])
    cycles: int = 4
    mixed: bool = False
    partitions: int = 6
    replication: int = 3
    segment_bytes: int = 8 * 1024  # small, so sealed segments exist to corrupt
    producers: int = 2
    consumers: int = 1
    recover_timeout: float = 60.0
    settle: float = 1.0  # seconds of traffic between healing and the next fault
    fail_fast: bool = False  # stop injecting after the first anomaly (short test runs)
    max_open_log_files: int = 0  # each node's budget of open log files (0: its default)
    say: Callable[[str], None] = field(default=lambda line: print(line, flush=True))

    def replay_command(self) -> str:
        return (
            f"python -m tests.faults --seed {self.seed} --nodes {self.nodes} "
            f"--cycles {self.cycles} --faults {','.join(self.faults)}"
            + (" --mixed" if self.mixed else "")
            + (f" --max-open-log-files {n}" if (n := self.max_open_log_files) else "")
        )


@dataclass
class RunReport:
    config: RunConfig
    schedule: list[Cycle]
    cycles_run: int
    verdict: Verdict | None
    events: list[str]
    anomalies: list[str]  # safety (checker) and liveness/crash findings together

    @property
    def anomaly_count(self) -> int:
        """All anomalies, also those the checker listed only in its count by kind."""
        listed = len(self.anomalies)
        if self.verdict is None:
            return listed
        return listed - len(self.verdict.anomalies) + self.verdict.anomaly_count

    def summary(self) -> str:
        verdict = self.verdict
        figures = (
            f"acked {verdict.acked}, indeterminate {verdict.indeterminate} "
            f"({verdict.indeterminate_written} of them written), "
            f"records in log {verdict.records_in_log}"
            if verdict
            else "no read-back"
        )
        status = "OK" if not self.anomalies else f"{self.anomaly_count} ANOMALIES"
        lines = [
            f"seed {self.config.seed}, {self.config.nodes} nodes, "
            f"{self.cycles_run} fault cycles: {figures}: {status}",
            *(f"  ! {anomaly}" for anomaly in self.anomalies),
        ]
        if self.anomalies:
            lines.append(f"  replay: {self.config.replay_command()}")
        return "\n".join(lines)


class _Workers:
    """Client worker processes; each gets a fresh log file per life (so kills lose nothing)."""

    def __init__(self, root: Path, bootstrap: str) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, list[Path]] = {"producer": [], "consumer": []}
        self._lives = Counter[str]()

    def start(self, kind: str, slot: int) -> None:
        name = f"{kind}-{slot}"
        life = self._lives[name]
        self._lives[name] += 1
        log = self.root / f"{name}.{life}.events"
        self.logs[kind].append(log)
        args = [sys.executable, "-m", "tests.faults.worker"]
        if kind == "producer":
            args += ["produce", self.bootstrap, TOPIC, str(log), f"p{slot}.{life}"]
        else:
            args += ["consume", self.bootstrap, TOPIC, str(log)]
        out = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - handed to the child
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self.processes[name] = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            env=env,
            cwd=REPO,
        )
        out.close()

    def kill(self, name: str) -> None:
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait()

    async def stop_all(self, timeout: float) -> list[str]:
        """SIGTERM (workers flush and exit), SIGKILL after ``timeout``; returns problems."""
        problems = []
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, process in self.processes.items():
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if process.poll() is None:
                problems.append(f"liveness: worker {name} did not finish within {timeout:.0f}s")
                self.kill(name)
        return problems


class FaultRun:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed * 7919 + 1)
        self.schedule = make_schedule(
            config.seed, config.nodes, config.faults, config.cycles, config.mixed
        )
        self.events: list[str] = []
        self.anomalies: list[str] = []
        self.down: set[int] = set()  # nodes the harness killed and has not restarted
        self.paused: set[int] = set()
        self.stuck = False  # some replica did not come back after a heal
        self.proxy: FaultProxy | None = None
        self.cluster: LocalCluster | None = None
        self.workers: _Workers | None = None
        self.started = time.monotonic()

    # reporting -----------------------------------------------------------------------------
    def note(self, line: str) -> None:
        stamp = f"[{time.monotonic() - self.started:7.1f}s] {line}"
        self.events.append(stamp)
        self.config.say(stamp)

    def anomaly(self, line: str) -> None:
        self.anomalies.append(line)
        self.note(f"ANOMALY {line}")

    # lifecycle ----------------------------------------------------------------------------
    async def execute(self) -> RunReport:
        config = self.config
        self.note(f"replay: {config.replay_command()}")
        for cycle in self.schedule:
            self.note(f"schedule {cycle}")
        cycles_run = 0
        verdict = None
        try:
            await self.start()
            for cycle in self.schedule:
                await self.run_cycle(cycle)
                cycles_run += 1
                if self.anomalies and config.fail_fast:
                    self.note("anomaly found: no more faults (fail_fast)")
                    break
            try:
                verdict = await self.finish()
            except (LaminarError, ConnectionError, TimeoutError) as exc:
                self.anomaly(f"liveness: read-back failed: {type(exc).__name__}: {exc}")
            else:
                self.anomalies.extend(verdict.anomalies)
        finally:
            await self.close()
        return RunReport(config, self.schedule, cycles_run, verdict, self.events, self.anomalies)

    async def start(self) -> None:
        config = self.config
        config.root.mkdir(parents=True, exist_ok=True)
        ports = free_port_pairs(config.nodes)
        real = {n: split_address(f"127.0.0.1:{peer}") for n, (_, peer) in enumerate(ports, 1)}
        self.proxy = FaultProxy(real)
        advertised = await self.proxy.start()
        self.cluster = LocalCluster(
            config.root / "cluster",
            ports,
            log_level="info",
            advertised_peers=[advertised[n] for n in sorted(advertised)],
            node_env=lambda n: {POWERLOSS_JOURNAL_ENV: str(self.journal(n))},
            extra_args=(
                ["--max-open-log-files", str(config.max_open_log_files)]
                if config.max_open_log_files
                else []
            ),
        )
        self.cluster.start()
        await self.cluster.wait_ready(config.recover_timeout)
        pairs = config.nodes * (config.nodes - 1) // 2
        if self.proxy.links_opened < pairs or not self.proxy.forwarded_datagrams:
            raise RuntimeError(  # faults injected at the proxy would then mean nothing
                f"peer traffic bypasses the proxy: {self.proxy.links_opened} links of {pairs}, "
                f"{self.proxy.forwarded_datagrams} datagrams"
            )
        async with Admin(self.cluster.bootstrap, request_timeout_ms=10_000) as admin:
            await admin.create_topic(
                TOPIC,
                config.partitions,
                config.replication,
                retention_ms=-1,
                segment_bytes=config.segment_bytes,
            )
        self.note(f"cluster of {config.nodes} up, topic {TOPIC} x{config.partitions} created")
        self.workers = _Workers(config.root, self.cluster.bootstrap)
        for slot in range(config.producers):
            self.workers.start("producer", slot)
        for slot in range(config.consumers):
            self.workers.start("consumer", slot)
        await asyncio.sleep(config.settle * 2)

    def journal(self, node_id: int) -> Path:
        return self.config.root / f"node-{node_id}.fsync-journal"

    async def close(self) -> None:
        if self.workers is not None:
            for name, process in self.workers.processes.items():
                if process.poll() is None:
                    self.workers.kill(name)
        if self.cluster is not None:
            for node_id in list(self.paused):
                self._signal(node_id, signal.SIGCONT)
            await asyncio.to_thread(self.cluster.stop, 10.0)
        if self.proxy is not None:
            await self.proxy.stop()

    # cycles ---------------------------------------------------------------------------------
    async def run_cycle(self, cycle: Cycle) -> None:
        self.note(f"begin {cycle}")
        for fault in cycle.faults:
            await self.inject(fault)
        before = self._acks_logged()
        await asyncio.sleep(cycle.hold)
        self.note(f"{self._acks_logged() - before} writes acknowledged during the fault")
        await self.heal(cycle)
        before = self._acks_logged()
        await asyncio.sleep(self.config.settle)
        self.note(
            f"{self._acks_logged() - before} writes acknowledged in {self.config.settle}s after"
        )

    async def inject(self, fault: Fault) -> None:
        kind, params = fault.kind, fault.params
        nodes = list(range(1, self.config.nodes + 1))
        if kind == "kill_one":
            self.kill([params["node"]])
        elif kind == "kill_leader":
            self.kill([await self.leader_node()])
        elif kind == "kill_majority":
            self.kill(params["nodes"])
        elif kind == "kill_all":
            self.kill(nodes)
        elif kind == "pause":
            node = await self.resolve(params["node"])
            if node not in self.down:
                self._signal(node, signal.SIGSTOP)
                self.paused.add(node)
                self.note(f"SIGSTOP node {node}")
        elif kind in ("isolate", "oneway"):
            node = await self.resolve(params["node"])
            others = [n for n in nodes if n != node]
            out = {(node, other) for other in others}
            into = {(other, node) for other in others}
            cut = {"both": out | into, "out": out, "in": into}[params.get("way", "both")]
            assert self.proxy is not None
            self.proxy.cut(cut)
            self.note(f"cut {sorted(cut)}")
        elif kind == "split":
            minority = set(params["minority"])
            majority = set(nodes) - minority
            cut = {(a, b) for a in minority for b in majority}
            cut |= {(b, a) for a, b in cut}
            assert self.proxy is not None
            self.proxy.cut(cut)
            self.note(f"split {sorted(minority)} | {sorted(majority)}")
        elif kind in ("powerloss_one", "powerloss_all"):
            targets = [params["node"]] if kind == "powerloss_one" else nodes
            self.kill(targets)
            for node in targets:
                data_dir = self._cluster.nodes[node].data_dir
                report = lose_power(data_dir, self.journal(node), self.rng, params["garble"])
                self.note(f"power loss on node {node}: {report}")
        elif kind == "corrupt":
            node = params["node"]
            data_dir = self._cluster.nodes[node].data_dir
            if params["how"] != "delete_index":  # these damage sealed segments: wait for one
                deadline = time.monotonic() + 30
                while not has_sealed_segment(data_dir) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            self.kill([node])
            what = corrupt(self._cluster.nodes[node].data_dir, params["how"], self.rng)
            self.note(f"corrupt node {node}: {what}")
        elif kind == "amnesia":
            await self._amnesia(params["lagging"], params["forgetful"], params["holder"])
        elif kind == "client_kill":
            assert self.workers is not None
            name = f"{params['client']}-0"
            self.workers.kill(name)
            self.workers.start(params["client"], 0)
            self.note(f"SIGKILL {name}, started again")
        else:
            raise ValueError(f"unknown fault {kind!r}")

    async def _amnesia(self, lagging: int, forgetful: int, holder: int) -> None:
        """Writes commit on {forgetful, holder} while ``lagging`` is cut off; then ``forgetful``
        loses its partition data (a wiped directory), ``holder`` goes down and the cut heals:
        ``forgetful`` and ``lagging`` are a majority, and neither has those writes. Raft is safe
        here only if a replica that lost its log does not vote as if it had it."""
        assert self.proxy is not None
        nodes = range(1, self.config.nodes + 1)
        cut = {(lagging, n) for n in nodes if n != lagging}
        self.proxy.cut(cut | {(b, a) for a, b in cut})
        self.note(f"amnesia: node {lagging} cut off while writes commit on the others")
        acked = await self._wait_for_acks(more=300, timeout=20.0)
        self.note(f"amnesia: {acked} writes acknowledged while node {lagging} was cut off")
        self.kill([forgetful, holder])
        shutil.rmtree(self._cluster.nodes[forgetful].data_dir / "partitions", ignore_errors=True)
        self.note(f"amnesia: node {forgetful} lost its partition data, node {holder} stays down")
        self.proxy.heal()
        self._cluster.start_node(forgetful)
        self.down.discard(forgetful)

    def _acks_logged(self) -> int:
        assert self.workers is not None
        count = 0
        for path in self.workers.logs["producer"]:
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as file:
                count += sum(1 for line in file if line.startswith(b"A "))
        return count

    async def _wait_for_acks(self, more: int, timeout: float) -> int:
        """Wait until the producers log ``more`` new acknowledgements (or ``timeout``)."""
        start = self._acks_logged()
        deadline = time.monotonic() + timeout
        while self._acks_logged() - start < more and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return self._acks_logged() - start

    async def heal(self, cycle: Cycle) -> None:
        assert self.proxy is not None
        self.proxy.heal()
        for node in sorted(self.paused):
            self._signal(node, signal.SIGCONT)
        self.paused.clear()
        self._crashed_on_their_own()
        for node in sorted(self.down):
            self._cluster.start_node(node)
        self.down.clear()
        self.note("healed: proxy open, nodes continued and restarted")
        begun = time.monotonic()
        try:
            await self._cluster.wait_ready(self.config.recover_timeout)
        except (TimeoutError, RuntimeError) as exc:
            self.anomaly(
                f"liveness: cluster not ready {self.config.recover_timeout:.0f}s after "
                f"healing {cycle}: {exc}"
            )
            self._crashed_on_their_own()
            return
        # once a node is known stuck, do not spend the full wait on it every cycle
        patience = 10.0 if self.stuck else self.config.recover_timeout
        silent = await self.replicas_not_serving(begun + patience)
        if silent:
            self.anomaly(
                f"liveness: {len(silent)} replicas not serving {patience:.0f}s after "
                f"healing {cycle}: {silent[:6]}"
            )
            self.stuck = True
            return
        self.note(f"recovered in {time.monotonic() - begun:.1f}s")

    async def replicas_not_serving(self, deadline: float) -> list[str]:
        """Wait until every replica of every partition answers a fetch and none is offline or
        awaiting re-admission (so the next cycle's data loss hits a minority, as it must for
        Raft to heal without an operator); those that did not."""
        problems = ["no answer yet"]
        while problems and time.monotonic() < deadline:
            problems = []
            try:
                async with Admin(self._cluster.bootstrap, request_timeout_ms=3_000) as admin:
                    description = await admin.describe_topic(TOPIC)
                    status = await admin.cluster_status()
                problems += [
                    f"{f.topic}/{f.partition}@node{f.node_id}: {f.state}" for f in status.faults
                ]
                consumer = Consumer(self._cluster.bootstrap, request_timeout_ms=3_000)
                await consumer.start()
            except (LaminarError, ConnectionError, TimeoutError) as exc:
                problems = [f"topic not described: {exc}"]
                await asyncio.sleep(0.3)
                continue
            try:
                for part in description.partitions:
                    tp = TopicPartition(TOPIC, part.partition)
                    for replica in part.replicas:
                        try:
                            await consumer.fetch_batches(tp, 0, 1, node_id=replica)
                        except (LaminarError, ConnectionError, TimeoutError) as exc:
                            problems.append(f"p{part.partition}@node{replica}: {exc}")
            finally:
                await consumer.close()
            if problems:
                await asyncio.sleep(0.3)
        return problems

    def kill(self, nodes: list[int]) -> None:
        for node in nodes:
            if node in self.down:
                continue
            self._cluster.kill_node(node)
            self.paused.discard(node)
            self.down.add(node)
            self.note(f"SIGKILL node {node}")

    def _crashed_on_their_own(self) -> None:
        for node in self._cluster.exited():
            if node.node_id not in self.down:
                self.anomaly(
                    f"crash: node {node.node_id} exited with code {node.returncode}: "
                    f"{self._cluster.log_tail(node.node_id, 5)}"
                )
                self.down.add(node.node_id)

    @property
    def _cluster(self) -> LocalCluster:
        assert self.cluster is not None
        return self.cluster

    def _signal(self, node_id: int, sig: int) -> None:
        process = self._cluster.nodes[node_id].process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)

    async def resolve(self, target: int | str) -> int:
        return await self.leader_node() if target == "leader" else int(target)

    async def leader_node(self) -> int:
        """The node leading most partitions of the topic now (node 1 if nobody answers)."""
        try:
            async with Admin(self._cluster.bootstrap, request_timeout_ms=3_000) as admin:
                description = await asyncio.wait_for(admin.describe_topic(TOPIC), 5)
        except (LaminarError, ConnectionError, TimeoutError) as exc:
            self.note(f"leader unknown ({exc}); taking node 1")
            return 1
        counts = Counter(p.leader for p in description.partitions if p.leader)
        node = counts.most_common(1)[0][0] if counts else 1
        self.note(f"leader of most partitions: node {node} ({dict(counts)})")
        return node

    # read-back and checks -------------------------------------------------------------------
    async def finish(self) -> Verdict:
        assert self.workers is not None
        self.note("final heal; stopping clients")
        for problem in await self.workers.stop_all(30):
            self.anomaly(problem)
        logs, divergences = await self.read_back()
        history = read_history(self.workers.logs["producer"], self.workers.logs["consumer"])
        verdict = check(history, logs, divergences)
        self.note(
            f"read back {verdict.records_in_log} records; acked {verdict.acked}, "
            f"indeterminate {verdict.indeterminate}"
        )
        return verdict

    async def read_back(self) -> tuple[dict[int, list[tuple[int, str]]], list[str]]:
        """Every partition from its leader, and each replica's bytes compared with it."""
        logs: dict[int, list[tuple[int, str]]] = {}
        divergences: list[str] = []
        async with Admin(self._cluster.bootstrap, request_timeout_ms=5_000) as admin:
            description = await admin.describe_topic(TOPIC)
        consumer = Consumer(self._cluster.bootstrap, request_timeout_ms=5_000)
        await consumer.start()
        patience = 10.0 if self.stuck else self.config.recover_timeout
        deadline = time.monotonic() + patience  # for all partitions together
        try:
            for part in description.partitions:
                tp = TopicPartition(TOPIC, part.partition)
                leader_hw = await self._converged_watermark(consumer, tp, part.replicas, deadline)
                if isinstance(leader_hw, str):
                    divergences.append(leader_hw)
                    leader_hw = None
                data, problem = await self._read_bytes(consumer, tp, None, leader_hw, deadline)
                if problem:
                    divergences.append(problem)
                records: list[ConsumerRecord] = []
                for position, header in iter_batches(data):
                    batch = data[position : position + header.batch_length]
                    try:
                        verify_batch(batch)
                    except LaminarError as exc:
                        divergences.append(
                            f"corrupt_served: leader of {tp} at {header.base_offset}: {exc}"
                        )
                        break
                    if not is_control(header):
                        decode_consumer_records(batch, header, TOPIC, tp.partition, 0, records)
                logs[tp.partition] = [(r.offset, (r.value or b"").decode()) for r in records]
                for replica in part.replicas:
                    theirs, problem = await self._read_bytes(
                        consumer, tp, replica, leader_hw, deadline
                    )
                    if problem:
                        divergences.append(problem)
                    elif theirs != data:
                        divergences.append(
                            f"divergence: {tp} replica {replica} serves {len(theirs)} bytes "
                            f"that differ from the leader's {len(data)} (first difference at "
                            f"byte {_first_difference(theirs, data)})"
                        )
        finally:
            await consumer.close()
        return logs, divergences

    async def _converged_watermark(
        self, consumer: Consumer, tp: TopicPartition, replicas: tuple[int, ...], deadline: float
    ) -> int | str:
        """The high watermark once every replica reports the same one (or a problem)."""
        seen: dict[int, int | str] = {}
        while True:
            for replica in replicas:
                try:
                    got = await consumer.fetch_batches(tp, 0, 1, node_id=replica)
                    seen[replica] = got.high_watermark
                except (LaminarError, ConnectionError, TimeoutError) as exc:
                    seen[replica] = f"{type(exc).__name__}: {exc}"
            values = set(seen.values())
            if len(values) == 1 and isinstance(next(iter(values)), int):
                return next(iter(values))  # type: ignore[return-value]
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.3)
        return f"divergence: {tp} replicas never agreed on a high watermark: {seen}"

    @staticmethod
    async def _read_bytes(
        consumer: Consumer,
        tp: TopicPartition,
        node_id: int | None,
        end: int | None,
        deadline: float,
    ) -> tuple[bytes, str]:
        """Whole batches [0, end) from one replica (the leader if None); (bytes, problem).

        A replica that answers NotLeader, or has not committed that far, may be under repair
        (it found damage while serving, went offline, catches up again): asked again until
        ``deadline``."""
        parts: list[bytes] = []
        offset = 0
        who = "leader" if node_id is None else f"replica {node_id}"
        try:
            while True:
                try:
                    got = await consumer.fetch_batches(tp, offset, 1 << 20, node_id=node_id)
                except NotLeaderError:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(0.3)
                    continue
                limit = got.high_watermark if end is None else end
                if offset >= limit:
                    break
                if not got.data:
                    if got.high_watermark < limit and time.monotonic() < deadline:
                        await asyncio.sleep(0.3)
                        continue
                    return b"".join(
                        parts
                    ), f"short_read: {tp} {who} served nothing at {offset} < {limit}"
                before = offset
                for position, header in iter_batches(got.data):
                    if header.base_offset >= limit:
                        break
                    parts.append(got.data[position : position + header.batch_length])
                    offset = header.base_offset + header.last_offset_delta + 1
                if offset == before:
                    break  # only batches at or past ``end``
        except (LaminarError, ConnectionError, TimeoutError) as exc:
            return b"".join(
                parts
            ), f"unreadable: {tp} {who} at {offset}: {type(exc).__name__}: {exc}"
        return b"".join(parts), ""


def _first_difference(a: bytes, b: bytes) -> int:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position
    return min(len(a), len(b))
