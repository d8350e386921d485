"""The run's OpenAI-compatible endpoint: `/v1/chat/completions` and `/v1/models` for agent environments.

It serves on the rollout engine's own event loop, in process, so a request is answered by the same
backend call an environment's episode would make (hf through the turn batcher, colocated vLLM, a vLLM
server) and agent code written for any OpenAI client runs unchanged. The loop runs only while a rollout
plays, which is exactly when agents send requests; between rollouts the socket stays bound and
connections wait in its backlog.

Each request belongs to one episode, named by a key: the path `/e/<key>/v1/...` (the base URL of the
client a rollout gets) or the bearer key (`Authorization: Bearer <key>`, for frameworks that build their
own client from a base URL and an API key). A request naming no open episode is refused. Bound to a
loopback address (the default, 127.0.0.1), only this machine can connect; bound to another address
(`--agent-host 0.0.0.0`: agents in a container or on another host), requests from elsewhere are served,
each still needing its episode's key; `allow_remote=False` refuses them anyway.

Left out: TLS and authentication beyond the per-episode keys (the endpoint listens on 127.0.0.1 by default).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from aiohttp import web

from aitrain_grpo.engine.agent_messages import EndpointError, models_body, stream_events
from aitrain_grpo.engine.agent_session import AgentSession
from aitrain_grpo.errors import ConfigError

LOCAL_HOST = "127.0.0.1"


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


class AgentEndpoint:
    """An aiohttp server holding the open episodes' sessions by key. `start` and `close` run on the
    engine's loop; `open`/`close_session` are plain calls."""

    def __init__(self, model_name: str, *, host: str = LOCAL_HOST, port: int = 0, allow_remote: bool | None = None):
        # Binding beyond loopback is how a user asks to serve other hosts: allowed unless said otherwise.
        allow_remote = not _is_loopback(host) if allow_remote is None else allow_remote
        self.model_name, self.host, self.port, self.allow_remote = model_name, host, port, allow_remote
        self.sessions: dict[str, AgentSession] = {}
        self._runner: web.AppRunner | None = None
        self.requests_refused = 0

    # ------------------------------------------------------------------------------- lifetime

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("", "/e/{key}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_get(prefix + "/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"the agent endpoint cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); "
                              f"pick a free --agent-port (0: any) and an address of this machine for --agent-host") from None
        self.port = site._server.sockets[0].getsockname()[1]
        self._runner = runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        """The address the run's own clients use: loopback when bound to every interface."""
        host = LOCAL_HOST if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def base_url(self, key: str) -> str:
        """The `/v1` base URL of one episode's requests."""
        return f"{self.url}/e/{key}/v1"

    def open(self, session: AgentSession) -> str:
        key = f"ep-{secrets.token_urlsafe(12)}"
        self.sessions[key] = session
        return key

    def close_session(self, key: str) -> None:
        session = self.sessions.pop(key, None)
        if session is not None:
            session.closed = True

    # ------------------------------------------------------------------------------- handlers

    def _session(self, request: web.Request) -> AgentSession:
        if not self.allow_remote and not _is_loopback(request.remote):
            raise EndpointError(403, f"requests from {request.remote} are refused; the endpoint serves this "
                                     "machine only", kind="permission_error", code="remote_refused")
        key = request.match_info.get("key")
        if key is None:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if key is None:
            raise EndpointError(401, "no episode key: use the base URL or the API key of the client your rollout "
                                     "was given", kind="authentication_error", code="no_episode")
        session = self.sessions.get(key)
        if session is None:
            raise EndpointError(409, "no open episode has this key (it was scored, or never existed); requests "
                                     "belong to a running rollout", code="episode_closed")
        return session

    @staticmethod
    def _error(exc: EndpointError) -> web.Response:
        return web.json_response(exc.body(), status=exc.status)

    async def _chat(self, request: web.Request) -> web.Response:
        session = None
        try:
            session = self._session(request)
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise EndpointError(400, "the request body is not JSON") from None
            if not isinstance(body, dict):
                raise EndpointError(400, "the request body must be a JSON object")
            completion = await session.complete(body)
            if body.get("stream"):
                options = body.get("stream_options")
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                return web.Response(body=stream_events(completion, usage), content_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache"})
            return web.json_response(completion)
        except EndpointError as exc:
            self.requests_refused += 1
            return self._error(exc)
        except Exception as exc:  # the backend or the oracle failed: the episode's player reports it
            if session is not None and session.failure is None:
                session.failure = exc
            return self._error(EndpointError(500, f"the trainer could not answer: {type(exc).__name__}: {exc}",
                                             kind="server_error"))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._session(request)
        except EndpointError as exc:
            return self._error(exc)
        return web.json_response(models_body(self.model_name))


__all__ = ["AgentEndpoint", "LOCAL_HOST"]
