"""A typed client of Gyre's public gRPC APIs: submit, watch, query, cancel (shell).

from gyre_app.client import GyreClient, ServiceAddresses, TaskSpec
"""

from gyre_app.client.addresses import ServiceAddresses
from gyre_app.client.api import (
    ExecutionDetail,
    GyreClient,
    RpcNotServed,
    Task,
    TaskPage,
    TaskProgress,
    TaskSpec,
)

__all__ = [
    "ExecutionDetail",
    "GyreClient",
    "RpcNotServed",
    "ServiceAddresses",
    "Task",
    "TaskPage",
    "TaskProgress",
    "TaskSpec",
]
