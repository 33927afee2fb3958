"""What the fake LLM says about itself, the way each kind of real server says it (see
gateway/llm/discovery.py): vLLM `max_model_len` in /v1/models, llama.cpp `/props`, Ollama
`/api/show`, LM Studio `/api/v0/models/<model>`; "openai" says nothing. Each kind answers only
its own endpoint; the others are 404 as on the real servers.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

ServerKind = Literal["vllm", "llamacpp", "ollama", "lmstudio", "openai"]


class DiscoveryEndpoints:
    """A mixin of FakeLLM, which sets these attributes."""

    server_kind: ServerKind
    context_window: int
    ollama_num_ctx: int | None
    api_key: str | None
    probes: list[str]
    served: tuple[str, ...] = ("m",)  # the ids /v1/models lists

    async def _models(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        # Anthropic's API (its /v1/models too) takes the key as x-api-key, the others as a bearer token.
        if getattr(self, "api", "") == "anthropic":
            refused = request.headers.get("x-api-key") != self.api_key
        else:
            refused = request.headers.get("Authorization") != f"Bearer {self.api_key}"
        if self.api_key is not None and refused:
            return web.json_response({"error": {"message": "Incorrect API key provided."}}, status=401)
        entries: list[dict[str, Any]] = []
        for model in self.served:
            entries.append({"id": model, "object": "model", "owned_by": self.server_kind})
            if self.server_kind == "vllm":
                entries[-1]["max_model_len"] = self.context_window
        return web.json_response({"object": "list", "data": entries})

    async def _props(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        if self.server_kind != "llamacpp":
            return web.json_response({"error": "not found"}, status=404)
        settings = {"n_ctx": self.context_window, "temperature": 0.8}
        return web.json_response({"default_generation_settings": settings, "total_slots": 1})

    async def _ollama_show(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        if self.server_kind != "ollama":
            return web.json_response({"error": "not found"}, status=404)
        parameters = f"num_ctx {self.ollama_num_ctx}\nstop <eos>" if self.ollama_num_ctx else "stop <eos>"
        info = {"llama.context_length": self.context_window}
        return web.json_response({"parameters": parameters, "model_info": info})

    async def _lmstudio_model(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        if self.server_kind != "lmstudio":
            return web.json_response({"error": "not found"}, status=404)
        model = request.match_info["model"]
        entry = {"id": model, "max_context_length": 32_768, "loaded_context_length": self.context_window}
        return web.json_response(entry)
