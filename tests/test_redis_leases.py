"""Owner leases on the Redis store (`gateway.stores.redis_leases`), script by script, against the tests'
own `redis-server`: two `RedisBackend`s on one prefix are two replicas.

Expiry is made by writing an old `lease` into the task hash (the lease's truth; the lease set is only
what scans read), so nothing here waits for a clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.metrics import Metrics
from gateway.protocol.era import Era
from gateway.stores.redis import RedisBackend, RedisEventLog, RedisTaskStore, WriterFenced
from gateway.stores.redis_leases import RedisLeases
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.lease_store import Claim, Renewal
from gateway.tasks.leases import OwnerLeases
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.registry import Task, TaskRegistry
from tests.redis_server import fresh_prefix, shared_redis_url
from tests.test_takeover import ChildUpstream
from tests.test_task_store import record

TTL_S = 60.0


@dataclass
class Replica:
    backend: RedisBackend
    tasks: RedisTaskStore
    log: RedisEventLog
    leases: RedisLeases
    lost: list[str] = field(default_factory=list)

    @classmethod
    def on(cls, prefix: str) -> Replica:
        backend = RedisBackend(shared_redis_url(), prefix, lease_ttl_s=TTL_S)
        replica = cls(backend, RedisTaskStore(backend, 10_000), RedisEventLog(backend, 1000), RedisLeases(backend))
        replica.leases.on_lost = replica.lost.append
        return replica

    async def create(self, task_id: str) -> None:
        await self.tasks.create(record(task_id, expires_at=2e9))
        await self.log.create(task_id)

    async def close(self) -> None:
        await self.log.close()
        await self.tasks.close()


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Replica, Replica]]:
    prefix = fresh_prefix()
    a, b = Replica.on(prefix), Replica.on(prefix)
    yield a, b
    await a.close()
    await b.close()


async def expire(replica: Replica, task_id: str) -> None:
    """The task's lease ran out (as if its owner stopped renewing long ago)."""
    keys = replica.backend.keys
    await replica.backend.client.hset(keys.task(task_id)[0], "lease", 1)
    await replica.backend.client.zadd(keys.leases, {task_id: 1})


async def test_a_created_task_is_leased_by_its_replica_and_renewed_by_compare_and_set(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    await a.create("t")
    hash_key = a.backend.keys.task("t")[0]
    replica, lease, epoch = await a.backend.client.hmget(hash_key, ["replica", "lease", "epoch"])
    assert (replica.decode(), epoch) == (a.backend.replica, b"0")
    assert a.leases.leased() == ["t"] and b.leases.leased() == []
    assert await a.backend.client.zscore(a.backend.keys.leases, "t") == int(lease)
    assert await a.leases.renew(["t"]) == {"t": Renewal(cancel_requested=False, input_waiting=False)}
    assert await b.leases.renew(["t"]) == {}  # not B's: the compare-and-set on the replica fails
    assert b.lost == ["t"] and a.lost == []


async def test_only_an_expired_lease_is_claimed(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    await a.create("live")
    await a.create("long")
    assert await b.leases.claim_expired() == []  # fresh leases: a long task is not a dead one
    # The lease set says expired, the hash (the truth) says renewed: not claimed, and the set is fixed.
    await b.backend.client.zadd(b.backend.keys.leases, {"long": 1})
    assert await b.leases.claim_expired() == []
    assert await b.backend.client.zscore(b.backend.keys.leases, "long") > 1
    await expire(a, "live")
    assert await b.leases.claim_expired() == [Claim("live", cancel_requested=False)]
    assert await b.tasks.epoch("live") == 1 and b.leases.leased() == ["live"]
    assert await a.leases.claim_expired() == []  # B's fresh lease now


async def test_a_claim_fences_the_former_owner(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    await a.create("t")
    assert await a.log.append("t", [b"a0"]) == 0
    await expire(a, "t")
    assert await b.leases.claim_expired() == [Claim("t", cancel_requested=False)]
    with pytest.raises(WriterFenced):
        await a.log.append("t", [b"late"])
    assert a.lost == ["t"] and a.leases.leased() == []  # told once, and leases it no more
    with pytest.raises(WriterFenced):  # every later write is refused too
        await a.log.append("t", [b"later"], seal=True)
    assert await a.tasks.update_status("t", TaskStatus.WORKING, TaskStatus.COMPLETED, None, "now") is None
    assert a.lost == ["t"]
    assert await b.log.append("t", [b"b1"]) == 1  # the new owner goes on at the next seq
    assert await b.tasks.update_status("t", TaskStatus.WORKING, TaskStatus.FAILED, "lost", "now") is not None
    assert [event.body for event in await b.log.read("t", -1, 10)] == [b"a0", b"b1"]


async def test_a_renewal_after_a_takeover_reports_the_task_lost(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    await a.create("t")
    await expire(a, "t")
    await b.leases.claim_expired()
    assert await a.leases.renew(["t"]) == {}
    assert a.lost == ["t"]


async def test_requests_reach_the_owner_and_a_claimant(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    await a.create("t")
    async with a.leases.requests() as next_request:
        signal = next_request()
        channel = a.backend.keys.control + a.backend.replica
        async with asyncio.timeout(30):
            while (await a.backend.client.pubsub_numsub(channel))[0][1] == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert await b.leases.request_input("t", {"k1": {"action": "accept"}})
        assert await b.leases.request_input("t", {"k2": {"action": "decline"}})
        async with asyncio.timeout(30):
            await signal.wait()  # told at once on its control channel
    assert await a.leases.renew(["t"]) == {"t": Renewal(cancel_requested=False, input_waiting=True)}
    assert await a.leases.take_input("t") == [{"k1": {"action": "accept"}}, {"k2": {"action": "decline"}}]
    assert await a.leases.take_input("t") == []  # taken once
    assert await b.leases.request_cancel("t")
    assert await a.leases.renew(["t"]) == {"t": Renewal(cancel_requested=True, input_waiting=False)}
    await expire(a, "t")  # the owner dies with the cancel recorded: the claimant learns of it
    assert await b.leases.claim_expired() == [Claim("t", cancel_requested=True)]


async def test_an_ended_task_takes_no_requests_and_leaves_the_lease_set(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    await a.create("t")
    await a.create("u")
    await a.tasks.update_status("t", TaskStatus.WORKING, TaskStatus.COMPLETED, None, "now")
    assert not await b.leases.request_cancel("t")
    assert not await b.leases.request_input("t", {"k": {}})
    await expire(a, "t")
    assert await b.leases.claim_expired() == []  # ended: nothing to take over, and dropped from the set
    assert await b.backend.client.zscore(b.backend.keys.leases, "t") is None
    await a.leases.release(["u"])
    assert a.leases.leased() == ["t"] and await a.backend.client.zscore(a.backend.keys.leases, "u") is None
    assert "u" not in a.backend.held  # released (ended, for the lease loop): its writes carry no epoch


async def test_a_task_that_ended_as_it_was_renewed_is_not_reported_lost(replicas: tuple[Replica, Replica]) -> None:
    a, _ = replicas
    await a.create("t")
    await a.tasks.update_status("t", TaskStatus.WORKING, TaskStatus.COMPLETED, None, "now")
    assert await a.leases.renew(["t"]) == {}  # nothing to renew, but still this replica's
    assert a.lost == [] and a.leases.leased() == ["t"]


async def test_a_replica_that_gives_up_its_leases_has_its_tasks_claimed_at_once(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    await a.create("running")
    await a.create("ended")
    await a.tasks.update_status("ended", TaskStatus.WORKING, TaskStatus.COMPLETED, None, "now")
    assert await b.leases.claim_expired() == []
    await a.leases.give_up()
    assert a.leases.leased() == []
    assert await b.leases.claim_expired() == [Claim("running", cancel_requested=False)]
    assert await b.tasks.epoch("running") == 1


async def test_a_tick_while_a_task_is_created_keeps_its_lease(replicas: tuple[Replica, Replica]) -> None:
    """A lease tick at the moment the store comes to hold a new task: the registry must know the task
    by the tick's next step, or the tick takes it for ended and releases its lease, which is then never
    renewed, nor claimed if the release came after the lease set entry (the task is never failed when
    its owner dies: a failover that never comes, as once in bench/redis_failover.py)."""
    a, _ = replicas
    config, metrics = Config(), Metrics()
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    registry = TaskRegistry(config.tasks, config.retention, a.tasks, a.log, capture, metrics)
    hosted = HostedTasks(registry, config.tasks, config.retention, True)
    passthrough = Passthrough(registry, ChildUpstream(), config.tasks, metrics)
    leases = OwnerLeases(a.leases, registry, hosted, lambda _: passthrough)
    held = a.backend.on_held
    assert held is not None
    ticks: list[asyncio.Task[None]] = []

    def hold_then_tick(task_id: str) -> None:
        held(task_id)
        ticks.append(asyncio.create_task(leases.tick()))  # runs at the creating coroutine's next await

    a.backend.on_held = hold_then_tick
    task = await registry.create("alice", "build", None, dialect=Era.LEGACY.value)
    async with asyncio.timeout(30):
        await asyncio.gather(*ticks)
    assert len(ticks) == 1
    assert a.leases.leased() == [task.id] and a.backend.held[task.id] == 0  # renewed, not released
    lease = await a.backend.client.hget(a.backend.keys.task(task.id)[0], "lease")
    assert await a.backend.client.zscore(a.backend.keys.leases, task.id) == int(lease)  # what scans find


async def test_the_scan_wakes_when_the_earliest_lease_expires_not_a_period_later(
    replicas: tuple[Replica, Replica],
) -> None:
    """B ticks every TTL/3 (20 s here). A stops renewing a task whose lease ends 0.3 s from now: B's
    first scan finds nothing expired and sets its next wake-up at that lease's end, not a period on; the
    scan it wakes claims the task, and B takes it over (`failed`, owner lost)."""
    a, b = replicas
    await a.create("t")
    seconds, micros = await a.backend.client.time()
    ends_ms = int(seconds) * 1000 + int(micros) // 1000 + 300
    await a.backend.client.hset(a.backend.keys.task("t")[0], "lease", ends_ms)
    await a.backend.client.zadd(a.backend.keys.leases, {"t": ends_ms})

    config, metrics = Config(), Metrics()
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    registry = TaskRegistry(config.tasks, config.retention, b.tasks, b.log, capture, metrics)
    hosted = HostedTasks(registry, config.tasks, config.retention, True)
    passthrough = Passthrough(registry, ChildUpstream(), config.tasks, metrics)
    leases = OwnerLeases(b.leases, registry, hosted, lambda _: passthrough)
    scans: list[list[Claim] | float | None] = []
    """What B's ticks found, in order: each scan's claims, then when it would wake for the next."""
    claim_expired, next_expiry_s, adopt = b.leases.claim_expired, b.leases.next_expiry_s, registry.adopt
    adopted: asyncio.Future[Task] = asyncio.get_running_loop().create_future()

    async def scanned() -> list[Claim]:
        claims = await claim_expired()
        scans.append(claims)
        return claims

    def adopting(record: TaskRecord) -> Task:
        task = adopt(record)
        adopted.set_result(task)
        return task

    async def next_wake() -> float | None:
        scans.append(await next_expiry_s())
        return scans[-1]  # type: ignore[return-value]

    b.leases.claim_expired = scanned  # type: ignore[method-assign]
    b.leases.next_expiry_s = next_wake  # type: ignore[method-assign]
    registry.adopt = adopting  # type: ignore[method-assign]
    leases.start()
    try:
        async with asyncio.timeout(leases.period_s):  # bounded by the period a fixed tick would wait
            task = await adopted
            await task.done.wait()  # taken over: ended by B
    finally:
        await leases.stop()
    assert task.status is TaskStatus.FAILED
    first_scan, wake_after_s, claims, *_ = scans
    assert first_scan == [] and claims == [Claim("t", cancel_requested=False)], scans
    assert isinstance(wake_after_s, float) and 0 < wake_after_s <= 0.3 < leases.period_s  # the lease's end
