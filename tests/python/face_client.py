"""The Python ACP SDK's client (PyPI `agent-client-protocol`) driving `supervisor acp`:
a turn with a tool call and a permission it allows, a cancelled turn, then a second
connection that lists and loads the session and goes on with it. Prints one JSON object
of what it saw; the Rust test (tests/it/face.rs) checks it.

usage: face_client.py SUPERVISOR URL CWD
"""

import asyncio
import json
import sys

from acp import spawn_agent_process, text_block
from acp.interfaces import Client
from acp.schema import AllowedOutcome, RequestPermissionResponse


class Recorder(Client):
    def __init__(self):
        self.lines = []
        self.permissions = 0
        self.chunk_seen = asyncio.Event()

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permissions += 1
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    async def session_update(self, session_id, update, **kwargs):
        kind = update.session_update
        if kind in ("user_message_chunk", "agent_message_chunk"):
            who = "user" if kind == "user_message_chunk" else "agent"
            self.lines.append(f"{who}: {update.content.text}")
        elif kind == "tool_call":
            self.lines.append(f"tool: {update.title}")
            self.chunk_seen.set()


async def main(supervisor, url, cwd):
    args = ["--url", url, "acp", "--agent", "mock"]
    seen = {}
    first = Recorder()
    async with spawn_agent_process(first, supervisor, *args) as (conn, _process):
        init = await conn.initialize(protocol_version=1)
        seen["agent"] = init.agent_info.name
        session = await conn.new_session(cwd=cwd, mcp_servers=[])
        sid = session.session_id
        answer = await conn.prompt(session_id=sid, prompt=[text_block("/permission\nfrom python")])
        seen["first_stop"] = answer.stop_reason
        first.chunk_seen.clear()
        slow = asyncio.ensure_future(
            conn.prompt(session_id=sid, prompt=[text_block("/tool\n/sleep 60000\nnever said")])
        )
        await first.chunk_seen.wait()
        await conn.cancel(session_id=sid)
        seen["cancelled_stop"] = (await slow).stop_reason
    seen["session"] = sid
    seen["permissions"] = first.permissions
    seen["first_lines"] = first.lines

    second = Recorder()
    async with spawn_agent_process(second, supervisor, *args) as (conn, _process):
        await conn.initialize(protocol_version=1)
        listed = await conn.list_sessions(cwd=cwd)
        seen["listed"] = [info.session_id for info in listed.sessions]
        await conn.load_session(session_id=sid, cwd=cwd, mcp_servers=[])
        answer = await conn.prompt(session_id=sid, prompt=[text_block("/recall")])
        seen["recall_stop"] = answer.stop_reason
    seen["second_lines"] = second.lines
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
