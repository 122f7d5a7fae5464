"""Waiting for an asynchronous consumer to store what a test sent (test helper)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

T = TypeVar("T")


async def once_found(fetch: Callable[[], Awaitable[T]], *, what: str, tries: int = 100) -> T:
    """`fetch()`'s answer once it stops answering NOT_FOUND; bounded: `tries` x 0.1 s."""
    for _ in range(tries):
        try:
            return await fetch()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"the trajectory service never stored {what}")
