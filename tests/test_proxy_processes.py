"""Several proxy processes behind one HTTP port, each execution served by its owner (issue 25).

The rig runs process 0 in this test process and process 1 as `python -m services.proxy`, both on
real NATS and Postgres; calls arrive on fresh connections, so the kernel spreads them over both
processes and about half land on the process that does not own their execution."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from proxy_support import Rig, start_rig, write_tokenizer

from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings
from services.proxy.peers import PROCESS_HEADER
from services.proxy.pinning import owner

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "What is the answer?"}]}


def test_owner_is_stable_in_range_and_spread() -> None:
    ids = [str(uuid.UUID(int=i * 7919)) for i in range(3000)]
    owners = [owner(e, processes=3) for e in ids]
    assert owners == [owner(e, processes=3) for e in ids]  # no per-process salt
    counts = [owners.count(i) for i in range(3)]
    assert all(800 < n < 1200 for n in counts), counts
    assert {owner(e, processes=1) for e in ids} == {0}
    assert owner("0b7e2a1c-0000-4000-8000-000000000000", processes=2) == owner(
        "0b7e2a1c-0000-4000-8000-000000000000", processes=2
    )
    with pytest.raises(ValueError, match="processes must be >= 1"):
        owner("e", processes=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, model_dir: Path) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, model_dir, num_engines=2, processes=2)
    yield rig
    await rig.close()


async def _on_both(rig: Rig, per_owner: int) -> list[tuple[str, str]]:
    """Fresh executions, `per_owner` of each process's (the hash decides which is whose)."""
    mine: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    for _ in range(200):  # bounded: a fair coin gives both sides long before
        if min(len(v) for v in mine.values()) >= per_owner:
            break
        token, execution_id = await rig.register_execution()
        side = mine[owner(execution_id, processes=2)]
        if len(side) < per_owner:
            side.append((token, execution_id))
    return mine[0] + mine[1]


async def _call(url: str, token: str, *, stream: bool) -> tuple[int, str, str]:
    """One call on a connection of its own: (status, serving process, body)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.post(
            f"{url}/v1/chat/completions",
            json={**BODY, "stream": stream},
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        return resp.status, resp.headers.get(PROCESS_HEADER, ""), await resp.text()


@pytest.mark.asyncio(loop_scope="session")
async def test_every_call_is_served_by_its_executions_owner(rig: Rig) -> None:
    executions = await _on_both(rig, 4)
    for token, execution_id in executions:
        for stream in (False, True, False):
            status, served_by, body = await _call(rig.http_url, token, stream=stream)
            assert status == 200, body
            assert served_by == str(owner(execution_id, processes=2)), (execution_id, served_by)
            assert ("data: [DONE]" in body) == stream
    # A bad token is refused where it lands, in the API's own shape.
    status, _, body = await _call(rig.http_url, "gyre-" + "0" * 48, stream=False)
    assert status == 401 and '"error"' in body
    # The revocation reaches each execution's owner, whose records count every call.
    for _, execution_id in executions:
        answer = await rig.stub.RevokeExecutionToken(
            proxy_pb2.RevokeExecutionTokenRequest(request_id=f"rev-{execution_id}", execution_id=execution_id)
        )
        assert answer.num_calls_recorded == 3 and answer.num_calls_cancelled == 0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_drain_reaches_every_process(rig: Rig) -> None:
    # Engines registered with process 0 served process 1's executions too (the test above);
    # a drain of cell-1 stops routing to it in both processes.
    answer = await rig.stub.DrainCell(
        proxy_pb2.DrainCellRequest(request_id=f"drain-{uuid.uuid4().hex[:8]}", cell_id="cell-1", timeout_s=5)
    )
    assert answer.drained
    drained_engine = rig.engines[0][1]
    before = len(drained_engine.prompts)
    executions = await _on_both(rig, 3)
    for token, execution_id in executions:
        status, served_by, body = await _call(rig.http_url, token, stream=False)
        assert status == 200 and served_by == str(owner(execution_id, processes=2)), body
    assert len(drained_engine.prompts) == before
    routing = await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())
    assert {r.engine_id: r.state for r in routing.routes}["engine-1"] == proxy_pb2.ROUTE_STATE_DRAINED
