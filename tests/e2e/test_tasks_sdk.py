"""MCP tasks through the official Python SDK (2.3) over the real binary's stdio.

The SDK has the 2025-11-25 task types (mcp_types) and sends tasks/get, /list,
/result and /cancel with ClientSession.send_request. It cannot create a task:
its result table admits only CallToolResult for tools/call under 2025-11-25
(mcp_types.methods.SERVER_RESULTS), so the task-augmented tools/call goes
through the same session's dispatcher as a raw request and is parsed with the
SDK's CreateTaskResult type.
"""

from __future__ import annotations

import asyncio

import mcp_types as t
from conftest import start_server


async def create_task(session, name: str, arguments: dict, ttl: int | None = None) -> t.CreateTaskResult:
    params = t.CallToolRequestParams(name=name, arguments=arguments, task=t.TaskMetadata(ttl=ttl))
    raw = await session._dispatcher.send_raw_request("tools/call", params.model_dump(by_alias=True, exclude_none=True), {})
    return t.CreateTaskResult.model_validate(raw, by_name=False)


async def test_sdk_task_lifecycle():
    async with start_server(tag="sdk-tasks") as srv:
        session = srv.session
        caps = session.server_capabilities
        assert caps.tasks is not None and caps.tasks.requests.tools is not None
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert tools["execute_code"].execution.task_support == "optional"
        assert tools["run_command"].execution.task_support == "optional"

        code = "import time; time.sleep(1.5); print('via-sdk')"
        created = await create_task(session, "execute_code", {"code": code}, ttl=60000)
        task_id = created.task.task_id
        assert created.task.status == "working"
        listed = await session.send_request(t.ListTasksRequest(), t.ListTasksResult)
        assert task_id in [task.task_id for task in listed.tasks]
        for _ in range(200):
            got = await session.send_request(t.GetTaskRequest(params=t.GetTaskRequestParams(task_id=task_id)), t.GetTaskResult)
            if got.status != "working":
                break
            await asyncio.sleep((got.poll_interval or 1000) / 4000)
        assert got.status == "completed"
        result = await session.send_request(
            t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task_id)), t.CallToolResult)
        assert "via-sdk" in result.structured_content["stdout"]

        # Another one, cancelled while it runs.
        created = await create_task(session, "execute_code", {"code": "import time; time.sleep(60)"})
        cancelled = await session.send_request(
            t.CancelTaskRequest(params=t.CancelTaskRequestParams(task_id=created.task.task_id)), t.CancelTaskResult)
        assert cancelled.status == "cancelled"
