"""Request body size limit: 413 before the body is read when Content-Length says so,
or as soon as a streamed body passes the limit."""

from __future__ import annotations

import json


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _reject(self, send) -> None:
        body = json.dumps({
            "error": "too_large",
            "detail": f"request body is over the limit of {self.max_bytes} bytes (FUSEWIRE_MAX_REQUEST_BYTES)",
            "where": "body",
        }).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    return await self._reject(send)
        state = {"received": 0, "over": False, "started": False}

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["over"] = True
                    raise _TooLarge()
            return message

        async def guarded_send(message):
            if state["over"]:  # the app answered an error about the cut body: answer 413 instead
                if message["type"] == "http.response.start" and not state["started"]:
                    state["started"] = True
                    await self._reject(send)
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not state["started"]:
                await self._reject(send)
