"""A real judge provider for the tests: an HTTP app in its own process, answering probabilities,
slowly, with an error status or with garbage, as `POST /control` asks; `GET /received` lists the
request bodies it was sent (as text) and the Authorization header of each.

Run: python tests/judge/judge_server.py PORT
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

state: dict[str, Any] = {"mode": "ok", "probabilities": {"allow": 0.9}, "delay": 0.0}
received: list[dict[str, Any]] = []


async def judge(request: Request) -> Response:
    body = (await request.body()).decode()
    received.append({"body": body, "authorization": request.headers.get("authorization", "")})
    if state["delay"]:
        await asyncio.sleep(state["delay"])
    mode = state["mode"]
    if mode == "error":
        return PlainTextResponse("boom", status_code=500)
    if mode == "malformed":
        return PlainTextResponse("this is not json")
    if mode == "no-probabilities":
        return JSONResponse({"answers": {"decision": {}}})
    return JSONResponse({"answers": {"decision": {"probabilities": state["probabilities"]}}})


async def control(request: Request) -> Response:
    state.update(await request.json())
    received.clear()
    return JSONResponse(state)


async def seen(request: Request) -> Response:
    return JSONResponse(received)


app = Starlette(routes=[
    Route("/judge", judge, methods=["POST"]),
    Route("/control", control, methods=["POST"]),
    Route("/received", seen, methods=["GET"]),
])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
