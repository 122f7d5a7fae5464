"""`gyre up --metrics`: each service the stack starts serves its own Prometheus endpoint."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from gyre.devstack.scratch import scratch_kernel
from gyre_app.stack import down, up


@pytest.mark.asyncio(loop_scope="session")
async def test_gyre_up_with_metrics_gives_each_service_an_endpoint(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with scratch_kernel(*server_urls, label="stackmetrics") as scratch:
        kernel = scratch.model_copy(update={"state_dir": tmp_path / "state"})
        state = await asyncio.to_thread(up, kernel, services=("scheduler", "trajectory"), metrics=True)
        try:
            urls = {s.name: s.metrics_url for s in state.services}
            pages = {name: await asyncio.to_thread(read, url) for name, url in urls.items()}
        finally:
            await asyncio.to_thread(down, kernel)
    assert len(set(urls.values())) == 2
    for name, page in pages.items():
        # the health checks `up` made while waiting for each service are its first timed RPCs
        assert 'method="/grpc.health.v1.Health/Check"' in page, name


def read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())
