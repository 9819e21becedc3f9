"""Baton's MCP server driven by the official Python SDK's client (PyPI `mcp`).

Usage: client.py STEP (stdio BATON_ARGS... | http URL TOKEN)

Each step talks MCP to Baton the way a host agent would and prints one JSON object with what
it saw; the Rust test that started it judges the object. Nothing here decides pass or fail,
except a protocol failure, which raises.
"""

import json
import sys

import anyio
import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


class Checked(ClientSession):
    """A session that checks every structured tool result against the tool's declared
    output schema with `jsonschema` (a validator independent of the server and of the SDK),
    raising on any result that does not conform."""

    validated = 0

    async def call_tool(self, name, arguments=None, *args, **kwargs):
        result = await super().call_tool(name, arguments, *args, **kwargs)
        if not result.is_error and result.structured_content is not None:
            if not hasattr(self, "_schemas"):
                tools = (await self.list_tools()).tools
                self._schemas = {t.name: t.output_schema for t in tools}
            schema = self._schemas.get(name)
            if schema is None:
                raise AssertionError(f"{name} returned structured content but declares no output schema")
            jsonschema.Draft202012Validator(schema).validate(result.structured_content)
            Checked.validated += 1
        return result


def structured(result):
    """A tool result as the test reads it: its structured content, or its error text."""
    if result.is_error:
        return {"error": result.content[0].text if result.content else ""}
    return result.structured_content


async def tour(s):
    """Every kind of tool, a resource and a prompt, over one session."""
    out = {}
    tools = (await s.list_tools()).tools
    out["tools"] = {t.name: {"input": t.input_schema, "output": t.output_schema} for t in tools}
    out["scenarios"] = structured(await s.call_tool("scenarios_list", {}))
    out["describe"] = structured(await s.call_tool("scenario_describe", {"scenario": "release_notes"}))
    out["describe_unknown"] = structured(await s.call_tool("scenario_describe", {"scenario": "nope"}))
    out["validate_bad"] = structured(
        await s.call_tool("scenario_validate", {"yaml": "id: broken\nversion: 1\nlevels:\n  - id: a\n    kind: nonsense\n"})
    )
    progress = []

    async def on_progress(p, total, message):
        progress.append({"progress": p, "total": total, "message": message})

    started = structured(
        await s.call_tool(
            "run_start",
            {"scenario": "release_notes", "input": "v2.4: CSV export, faster search, login loop fix", "wait_s": 60},
            progress_callback=on_progress,
        )
    )
    out["started"] = started
    out["start_progress"] = progress
    run_id = started["run_id"]
    out["get_paused"] = structured(await s.call_tool("run_get", {"run_id": run_id}))
    out["approve"] = structured(
        await s.call_tool("run_approve", {"run_id": run_id, "comment": "ship it"})
    )
    out["approve_again"] = structured(await s.call_tool("run_approve", {"run_id": run_id}))
    for _ in range(300):
        got = structured(await s.call_tool("run_get", {"run_id": run_id}))
        if got["status"] not in ("running", "interrupted"):
            break
        await anyio.sleep(0.1)
    out["get_done"] = got
    out["events"] = structured(await s.call_tool("run_events", {"run_id": run_id, "limit": 5}))
    out["events_rest"] = structured(
        await s.call_tool("run_events", {"run_id": run_id, "after": out["events"]["next_after"], "limit": 500})
    )
    out["bad_args"] = None
    try:
        await s.call_tool("run_get", {"run": run_id})
    except Exception as e:  # a protocol error: the arguments do not fit the schema
        out["bad_args"] = str(e)
    try:
        await s.call_tool("no_such_tool", {})
        out["unknown_tool"] = None
    except Exception as e:
        out["unknown_tool"] = str(e)
    resources = await s.list_resources()
    out["resources"] = [str(r.uri) for r in resources.resources]
    templates = await s.list_resource_templates()
    out["templates"] = [t.uri_template for t in templates.resource_templates]
    timeline = await s.read_resource(f"baton://runs/{run_id}/timeline")
    out["timeline"] = timeline.contents[0].text
    guide = await s.read_resource("baton://guide")
    out["guide"] = guide.contents[0].text
    prompts = await s.list_prompts()
    out["prompts"] = [p.name for p in prompts.prompts]
    out["prompt_baton"] = (await s.get_prompt("baton")).messages[0].content.text
    out["prompt_waves"] = (await s.get_prompt("baton:waves")).messages[0].content.text
    return out


async def subscribe(s):
    """A run's timeline, subscribed while another process decides the run."""
    started = structured(
        await s.call_tool("run_start", {"scenario": "release_notes", "input": "v2.5", "wait_s": 60})
    )
    run_id = started["run_id"]
    uri = f"baton://runs/{run_id}/timeline"
    await s.subscribe_resource(uri)
    print(json.dumps({"subscribed": run_id}), flush=True)
    # The test approves the run from another process now; the growth of its log is told
    # (growths close together are told once).
    with anyio.move_on_after(60):
        while not UPDATES or not await ended(s, run_id):
            await anyio.sleep(0.1)
    timeline = (await s.read_resource(uri)).contents[0].text
    status = structured(await s.call_tool("run_get", {"run_id": run_id}))["status"]
    return {"run_id": run_id, "updates": UPDATES, "status": status, "timeline": timeline}


async def ended(s, run_id):
    got = structured(await s.call_tool("run_get", {"run_id": run_id}))
    return got["status"] in ("completed", "failed", "aborted", "cancelled")


UPDATES = []


async def on_message(message):
    root = getattr(message, "root", message)
    if getattr(root, "method", None) == "notifications/resources/updated":
        UPDATES.append(str(root.params.uri))


async def wave(s):
    """A wave of three: the first dispatched to an outside worker, two run by Baton with progress
    notifications, the outside outcome recorded, the wave decided, completed, summarised."""
    out = {}
    tasks = [
        {"id": "t1", "title": "Write the changelog", "description": "outside agent", "priority": "high"},
        {"id": "t2", "title": "Implement the todo API"},
        {"id": "t3", "title": "Add API tests"},
    ]
    out["plan"] = structured(
        await s.call_tool("wave_plan", {"tasks": tasks, "worker": "worker", "max_parallel": 2, "context": "Goal: todo API"})
    )
    out["current"] = structured(await s.call_tool("wave_get", {"wave_id": "current"}))
    out["dispatch"] = structured(
        await s.call_tool("wave_dispatch", {"wave_id": "current", "links": [{"task_id": "t1", "worker_run_id": "outside-1"}]})
    )
    progress = []

    async def on_progress(p, total, message):
        progress.append({"progress": p, "total": total, "message": message})

    out["run"] = structured(
        await s.call_tool("wave_run", {"wave_id": "current", "max_parallel": 2}, progress_callback=on_progress)
    )
    out["run_progress"] = progress
    out["decide_before"] = structured(await s.call_tool("wave_decide", {"wave_id": "current"}))
    out["record"] = structured(
        await s.call_tool(
            "wave_record",
            {"wave_id": "current", "task_id": "t1", "outcome": "completed", "summary": "changelog written"},
        )
    )
    out["record_again"] = structured(
        await s.call_tool("wave_record", {"wave_id": "current", "task_id": "t1", "outcome": "failed"})
    )
    out["decide"] = structured(await s.call_tool("wave_decide", {"wave_id": "current"}))
    out["complete"] = structured(await s.call_tool("wave_complete", {"wave_id": "current"}))
    wave_id = out["plan"]["run_id"]
    for _ in range(300):
        got = structured(await s.call_tool("run_get", {"run_id": wave_id}))
        if got["status"] == "completed":
            break
        await anyio.sleep(0.1)
    out["wave_run_status"] = got["status"]
    out["get"] = structured(await s.call_tool("wave_get", {"wave_id": wave_id}))
    out["list"] = structured(await s.call_tool("wave_list", {}))
    out["summary"] = structured(await s.call_tool("wave_summary", {}))
    out["current_after"] = structured(await s.call_tool("wave_get", {"wave_id": "current"}))
    out["prompt_waves"] = (await s.get_prompt("baton:waves")).messages[0].content.text
    return out


async def cancel(s):
    """Two slow runs, each started with a wait that the client abandons: the one started
    with cancel_with_call is cancelled, the other goes on."""
    out = {}
    for flag in (True, False):
        seen = []

        async def on_progress(p, total, message):
            seen.append(message)

        with anyio.move_on_after(4):
            await s.call_tool(
                "run_start",
                {"scenario": "slow", "input": f"flag {flag}", "wait_s": 60, "cancel_with_call": flag},
                progress_callback=on_progress,
            )
        runs = structured(await s.call_tool("wave_summary", {}))  # any call: the session still works
        out[f"after_{flag}"] = runs
        out[f"progress_{flag}"] = seen
    await anyio.sleep(1)
    resources = await s.list_resources()
    ids = [str(r.uri).split("/")[3] for r in resources.resources if str(r.uri).startswith("baton://runs/")]
    out["runs"] = [structured(await s.call_tool("run_get", {"run_id": i})) for i in ids]
    # A wave run by a call that is abandoned: with cancel_with_call, the wave is cancelled.
    plan = structured(await s.call_tool("wave_plan", {"tasks": [{"id": "w1", "title": "slow work"}], "worker": "slow"}))
    wave_progress = []

    async def on_wave_progress(p, total, message):
        wave_progress.append(message)

    with anyio.move_on_after(3):
        await s.call_tool("wave_run", {"cancel_with_call": True}, progress_callback=on_wave_progress)
    for _ in range(300):
        wave = structured(await s.call_tool("wave_get", {"wave_id": plan["run_id"]}))
        if wave["run_status"] == "cancelled":
            break
        await anyio.sleep(0.1)
    out["wave"] = wave
    out["wave_progress"] = wave_progress
    return out


async def tenants(s):
    """What a token of another tenant, or a viewer, gets."""
    out = {}
    out["scenarios"] = structured(await s.call_tool("scenarios_list", {}))
    out["start"] = structured(await s.call_tool("run_start", {"scenario": "quick_qa", "input": "2+2?", "wait_s": 30}))
    out["resources"] = [str(r.uri) for r in (await s.list_resources()).resources]
    if len(sys.argv) > 5:
        other = sys.argv[5]
        out["other_get"] = structured(await s.call_tool("run_get", {"run_id": other}))
        out["other_events"] = structured(await s.call_tool("run_events", {"run_id": other}))
        out["other_cancel"] = structured(await s.call_tool("run_cancel", {"run_id": other}))
        out["other_wave"] = structured(await s.call_tool("wave_get", {"wave_id": other}))
        try:
            await s.read_resource(f"baton://runs/{other}/timeline")
            out["other_timeline"] = "read"
        except Exception as e:
            out["other_timeline"] = str(e)
        out["tenant_arg"] = structured(
            await s.call_tool("run_start", {"scenario": "quick_qa", "input": "x", "tenant": "someone-else"})
        )
    return out


async def modern(server):
    """The high-level client on the newest protocol it finds (server/discover, 2026-07-28):
    tools without a session, and a run's timeline heard through subscriptions/listen while
    another process decides the run."""
    from mcp import Client

    out = {}
    async with Client(server, mode="auto") as c:
        out["protocol"] = c.session.protocol_version
        out["tools"] = len((await c.list_tools()).tools)
        started = structured(
            await c.call_tool("run_start", {"scenario": "release_notes", "input": "v2.6", "wait_s": 60})
        )
        run_id = started["run_id"]
        out["paused"] = started["run"]["status"]
        uri = f"baton://runs/{run_id}/timeline"
        heard = []
        async with c.listen(resource_subscriptions=[uri]) as sub:
            out["honored"] = list(sub.honored.resource_subscriptions or [])
            print(json.dumps({"subscribed": run_id}), flush=True)
            with anyio.move_on_after(60):
                async for event in sub:
                    heard.append(str(getattr(event, "uri", event)))
                    got = structured(await c.call_tool("run_get", {"run_id": run_id}))
                    if got["status"] == "completed":
                        break
        out["heard"] = heard
        out["status"] = structured(await c.call_tool("run_get", {"run_id": run_id}))["status"]
        out["run_id"] = run_id
    return out


async def listen_outcome(c, uri):
    """What subscriptions/listen to `uri` came to: the error that ended it, or that it went on."""
    try:
        async with c.listen(resource_subscriptions=[uri]) as sub:
            with anyio.move_on_after(5):
                async for _ in sub:
                    pass
                return "went on"
            return "went on"
    except Exception as e:
        return f"error: {e}"


async def race(s):
    """One of several racers: connected, it waits for the go file, then makes the decision
    (`approve RUN` or `record WAVE TASK`) and prints what it got."""
    import os

    what = os.environ["RACE"].split()
    print(json.dumps({"ready": True}), flush=True)
    while not os.path.exists(os.environ["RACE_GO"]):
        await anyio.sleep(0.005)
    if what[0] == "approve":
        got = await s.call_tool("run_approve", {"run_id": what[1], "comment": f"by {os.getpid()}"})
    else:
        got = await s.call_tool(
            "wave_record", {"wave_id": what[1], "task_id": what[2], "outcome": "completed", "summary": f"by {os.getpid()}"}
        )
    return {"result": structured(got)}


STEPS = {"race": race, "tour": tour, "subscribe": subscribe, "wave": wave, "cancel": cancel, "tenants": tenants}


async def main():
    if sys.argv[1] == "modern_http":
        # The 2026-07-28 protocol over HTTP: no session, every request carries the token.
        from mcp import Client

        url, token = sys.argv[3], sys.argv[4]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            async with Client(streamable_http_client(url, http_client=http), mode="auto") as c:
                out = {"protocol": c.session.protocol_version}
                out["start"] = structured(
                    await c.call_tool("run_start", {"scenario": "quick_qa", "input": "2+2?", "wait_s": 30})
                )
                out["other_get"] = structured(await c.call_tool("run_get", {"run_id": sys.argv[5]}))
                # Another tenant's timeline and a missing one are answered alike.
                for key, run in [("other_listen", sys.argv[5]), ("missing_listen", "no-such-run")]:
                    out[key] = await listen_outcome(c, f"baton://runs/{run}/timeline")
        print(json.dumps(out), flush=True)
        return
    if sys.argv[1] == "modern":
        out = await modern(StdioServerParameters(command=sys.argv[3], args=sys.argv[4:]))
        print(json.dumps(out), flush=True)
        return
    step = STEPS[sys.argv[1]]
    if sys.argv[2] == "stdio":
        params = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        async with stdio_client(params) as (read, write):
            async with Checked(read, write, message_handler=on_message) as s:
                await s.initialize()
                out = await step(s)
    else:
        url, token = sys.argv[3], sys.argv[4]
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client, streamable_http_client(url, http_client=client) as (read, write, *_):
            async with Checked(read, write, message_handler=on_message) as s:
                await s.initialize()
                out = await step(s)
    if isinstance(out, dict):
        out["validated"] = Checked.validated
    print(json.dumps(out), flush=True)


anyio.run(main)
