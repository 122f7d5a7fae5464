"""Embedded NATS and PostgreSQL: real servers from the wheels, used, re-used, restarted and stopped."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gyre.devstack.embedded import EmbeddedServer, start_nats, start_postgres, stop_nats, stop_postgres


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting to be reaped."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def _publish_and_read_back(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="EMBEDDED", subjects=["embedded.>"])
        ack = await js.publish("embedded.hello", b"hello")
        assert ack.seq == 1
        reader = await js.pull_subscribe("embedded.hello", durable="reader")
        [msg] = await reader.fetch(1, timeout=5)
        assert msg.data == b"hello"
        await msg.ack()
    finally:
        await nc.close()


async def _count_stream_messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info("EMBEDDED")
        return int(info.state.messages)
    finally:
        await nc.close()


@pytest.mark.slow
async def test_nats_serves_jetstream_is_reused_and_keeps_streams_across_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "nats"
    server = await asyncio.to_thread(start_nats, data_dir)
    try:
        assert server.name == "nats"
        assert server.url.startswith("nats://127.0.0.1:")
        assert not server.url.endswith(":4222")
        await _publish_and_read_back(server.url)
        assert await asyncio.to_thread(start_nats, data_dir) == server
    finally:
        await asyncio.to_thread(stop_nats, server)
    assert not _running(server.pid)

    restarted = await asyncio.to_thread(start_nats, data_dir)
    try:
        assert restarted.pid != server.pid
        assert restarted.url == server.url  # the freed port is taken again
        assert await _count_stream_messages(restarted.url) == 1
    finally:
        await asyncio.to_thread(stop_nats, restarted)
    assert not _running(restarted.pid)
    await asyncio.to_thread(stop_nats, restarted)  # stopping a stopped server is a no-op


@pytest.mark.slow
async def test_postgres_serves_sql_is_reused_and_keeps_tables_across_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    server = await asyncio.to_thread(start_postgres, data_dir)
    try:
        assert server.name == "postgres"
        assert server.url.startswith("postgresql+asyncpg://postgres@127.0.0.1:")
        assert ":5432/" not in server.url
        engine = create_async_engine(server.url)
        try:
            async with engine.begin() as conn:
                assert (await conn.execute(text("select 1"))).scalar_one() == 1
                await conn.execute(text("create table cells (id int primary key, name text not null)"))
                await conn.execute(text("insert into cells values (1, 'alpha')"))
        finally:
            await engine.dispose()
        assert await asyncio.to_thread(start_postgres, data_dir) == server
    finally:
        await asyncio.to_thread(stop_postgres, data_dir)
    assert not _running(server.pid)

    restarted = await asyncio.to_thread(start_postgres, data_dir)
    try:
        assert restarted.pid != server.pid
        engine = create_async_engine(restarted.url)
        try:
            async with engine.connect() as conn:
                assert (await conn.execute(text("select name from cells"))).scalar_one() == "alpha"
        finally:
            await engine.dispose()
    finally:
        await asyncio.to_thread(stop_postgres, data_dir)
    assert not _running(restarted.pid)
    await asyncio.to_thread(stop_postgres, data_dir)  # stopping a stopped server is a no-op


@pytest.mark.slow
def test_postgres_failure_names_the_step_and_shows_its_output(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    data_dir.mkdir()
    (data_dir / "stray.txt").write_text("not a database\n")

    with pytest.raises(RuntimeError, match=r"initdb .* failed") as failure:
        start_postgres(data_dir, timeout_s=30.0)

    assert "not empty" in str(failure.value)


@pytest.mark.slow
def test_stop_nats_leaves_a_process_it_did_not_start(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        impostor = EmbeddedServer(
            name="nats",
            pid=stranger.pid,
            url="nats://127.0.0.1:1",
            data_dir=tmp_path,
            log_path=tmp_path / "nats.log",
        )
        stop_nats(impostor, timeout_s=1.0)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(timeout=5)
