"""The models one server serves, by name and version, and loading, unloading and swapping them at run time.

Each model is its own engine (with `tachyon serve`, its own engine-core process) and its own OpenAIServing. A
client names one as NAME (that name's default version) or NAME@VERSION:

    load  NAME v2      build the engine (the others keep serving) ─► routable as NAME@v2 (and NAME if NAME is new)
    swap  NAME -> v2   build v2 ─► NAME and NAME@v2 go to v2, NAME@v1 is gone ─► v1 drains ─► v1 shut down
    unload NAME@v1     not routable any more (404) ─► drains ─► shut down (its core process exits)

Draining: a model taken out of the routing tables keeps its engine until every request already in it has
finished, or the drain timeout passes (then what is left is aborted: those streams end with finish_reason
"abort"). A request counts from the moment its handler picked the model (`use`), before its engine request
exists, so none slips in between the switch and the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, ConfigDict, Field

from tachyon.engine.async_engine import AsyncEngine
from tachyon.server.errors import APIError
from tachyon.server.frontend import FrontendOptions
from tachyon.server.metrics import ServerMetrics
from tachyon.server.serving import OpenAIServing

logger = logging.getLogger("tachyon")

_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# -- the admin API's request bodies ----------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LoadModelRequest(_Body):
    model: str = Field(min_length=1, description="a checkpoint directory, Hub id or .gguf file")
    served_model_name: str | list[str] | None = Field(
        None, description="the names clients send (default: the Hub id or the path's basename)")
    version: str | None = Field(None, description="clients reach it as NAME@VERSION; shown in /v1/models")


class SwapModelRequest(LoadModelRequest):
    model: str | None = Field(None, min_length=1, description="the new version's checkpoint; none: the version "
                                                              "is already loaded (a canary), and takes over")
    drain_timeout_s: float = Field(60.0, ge=0, description="how long the old version's requests may still run; "
                                                          "then they are aborted")


class UnloadModelRequest(_Body):
    model: str = Field(min_length=1, description="NAME (its default version) or NAME@VERSION")
    drain_timeout_s: float = Field(60.0, ge=0, description="how long its requests may still run; then they are "
                                                          "aborted")


# -- one served model ------------------------------------------------------------------------------------------
@dataclass(eq=False)
class ServedModel:
    names: list[str]  # what clients send; names[0] is what responses carry
    version: str | None
    root: str | None  # the checkpoint it was loaded from
    async_engine: AsyncEngine
    serving: OpenAIServing
    metrics: ServerMetrics
    created: int = field(default_factory=lambda: int(time.time()))
    handlers: int = 0  # HTTP handlers that picked this model and have not handed their requests to the engine
    draining: bool = False

    @property
    def keys(self) -> list[str]:
        """NAME@VERSION for each name (NAME alone without a version)."""
        return [f"{n}@{self.version}" if self.version else n for n in self.names]

    @property
    def label(self) -> str:
        return self.keys[0]

    @property
    def pid(self) -> int | None:
        """The engine-core process (None: the engine runs in this process)."""
        process = getattr(self.async_engine.engine, "process", None)
        return None if process is None else process.pid

    def in_flight(self) -> int:
        """Requests running in its engine."""
        return len(self.async_engine.engine.request_ids())

    def busy(self) -> bool:
        return self.handlers > 0 or self.in_flight() > 0

    def describe(self, default_for: list[str]) -> dict:
        return {"model": self.label, "names": self.names, "version": self.version, "root": self.root,
                "default_for": default_for, "state": "draining" if self.draining else "serving",
                "in_flight": self.in_flight(), "engine_pid": self.pid, "created": self.created}


# What the app builds around an engine: (async engine, its front-end options, names, version, root) -> ServedModel
MakeModel = Callable[[AsyncEngine, FrontendOptions, list[str], str | None, str | None], ServedModel]
# Blocking: builds and returns the engine of a checkpoint, and its front-end options (default sampling values)
Loader = Callable[[str], tuple[AsyncEngine, FrontendOptions]]


class ModelRegistry:
    """Which ServedModel answers a model name, and the admin operations that change it (one at a time)."""

    def __init__(self, make_model: MakeModel, loader: Loader | None, derive_names: Callable[[str], list[str]]):
        self.make_model = make_model
        self.loader = loader
        self.derive_names = derive_names
        self.models: list[ServedModel] = []  # routable ones, in load order
        self.defaults: dict[str, ServedModel] = {}  # NAME -> the version NAME alone reaches
        self.retiring: list[ServedModel] = []  # draining, not yet shut down
        self.draining = False  # the server is shutting down
        self._admin = asyncio.Lock()

    # -- lookup ------------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every name a request may send: NAME for each default, NAME@VERSION for each model."""
        return list(dict.fromkeys([*self.defaults, *(k for m in self.models for k in m.keys)]))

    def resolve(self, name: str | None) -> ServedModel:
        """The model a request names (None: the first one loaded); 404 if none is routable by that name."""
        if name is None and self.models:
            return self.models[0]
        model = self.defaults.get(name) if name is not None else None
        if model is None:
            model = next((m for m in self.models if name in m.keys), None)
        if model is None:
            served = ", ".join(repr(n) for n in self.names()) or "none (POST /admin/models/load loads one)"
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", "model")
        return model

    @contextlib.contextmanager
    def use(self, name: str | None) -> Iterator[ServedModel]:
        """The model a request names, held (not shut down) until the handler returns; by then a streamed
        response's engine requests exist and the drain sees them."""
        model = self.resolve(name)
        model.handlers += 1
        try:
            yield model
        finally:
            model.handlers -= 1

    def default_for(self, model: ServedModel) -> list[str]:
        return [n for n, m in self.defaults.items() if m is model]

    # -- changes -----------------------------------------------------------------------------------------------
    def _check_free(self, keys: list[str], replaced: list[ServedModel] = ()) -> None:
        taken = [k for k in keys if any(k in m.keys for m in self.models if m not in replaced)]
        if taken:
            raise APIError(409, f"{', '.join(taken)} is already loaded: unload it first, or give another version")

    def add(self, model: ServedModel, make_default: bool = False) -> None:
        """Routable from now on; the default of each of its names that has none (all of them: make_default)."""
        self._check_free(model.keys)
        self.models.append(model)
        for n in model.names:
            if make_default or n not in self.defaults:
                self.defaults[n] = model

    def _withdraw(self, model: ServedModel) -> None:
        """Not routable any more; a name it was the default of falls back to its newest other version."""
        self.models.remove(model)
        model.draining = True
        self.retiring.append(model)
        for n in self.default_for(model):
            newest = next((m for m in reversed(self.models) if n in m.names), None)
            if newest is None:
                del self.defaults[n]
            else:
                self.defaults[n] = newest

    def _check_names(self, req: LoadModelRequest) -> tuple[list[str], list[str]]:
        """The names a load asks for, and the keys it would take (NAME@VERSION, or NAME)."""
        if req.version is not None and not _VERSION.fullmatch(req.version):
            raise APIError(400, f"version {req.version!r}: use letters, digits, '.', '_' or '-' (at most 64)",
                           "version")
        given = req.served_model_name
        if not given and req.model is None:
            raise APIError(400, "give the model (a checkpoint) or the served_model_name and version of a loaded one",
                           "served_model_name")
        names = [given] if isinstance(given, str) else list(given or ()) or self.derive_names(req.model)
        bad = next((n for n in names if not n or "@" in n), None)
        if bad is not None:
            raise APIError(400, f"served_model_name {bad!r}: a name must be non-empty and without '@' (the version "
                                "goes in 'version')", "served_model_name")
        return names, [f"{n}@{req.version}" if req.version else n for n in names]

    async def _build(self, req: LoadModelRequest, names: list[str]) -> ServedModel:
        if self.draining:
            raise APIError(503, "the server is shutting down: no model is loaded now")
        if self.loader is None:
            raise APIError(400, "this server cannot load models (it was built without a model loader)")
        t0 = time.perf_counter()
        try:
            async_engine, options = await asyncio.to_thread(self.loader, req.model)
        except Exception as e:
            logger.exception("loading %s failed", req.model)
            raise APIError(400, f"could not load the model {req.model!r}: {e}", "model") from None
        if self.draining:  # the server began shutting down while it loaded: nobody would stop it
            await asyncio.to_thread(async_engine.shutdown)
            raise APIError(503, "the server is shutting down: the model was loaded, then stopped")
        async_engine.start()
        model = self.make_model(async_engine, options, names, req.version, req.model)
        logger.info("model %s loaded from %s in %.1fs", model.label, req.model, time.perf_counter() - t0)
        return model

    async def load(self, req: LoadModelRequest) -> dict:
        async with self._admin:
            names, keys = self._check_names(req)
            self._check_free(keys)  # before building anything
            model = await self._build(req, names)
            self.add(model)
            return {"loaded": model.describe(self.default_for(model))}

    async def unload(self, req: UnloadModelRequest) -> dict:
        async with self._admin:
            model = self.resolve(req.model)
            self._withdraw(model)
            drained = await self._retire(model, req.drain_timeout_s)
            return {"unloaded": model.label, **drained}

    async def swap(self, req: SwapModelRequest) -> dict:
        """The new version (built now, or a loaded one) takes NAME's requests; the versions it replaces drain and
        shut down."""
        async with self._admin:
            names, keys = self._check_names(req)
            loaded = None
            if req.model is None:  # promote a loaded version
                loaded = next((m for m in self.models if m.keys == keys), None)
                if loaded is None:
                    raise APIError(404, f"{', '.join(keys)} is not loaded: give its checkpoint as 'model'", "version")
            old = list(dict.fromkeys(self.defaults[n] for n in names if n in self.defaults and
                                     self.defaults[n] is not loaded))
            if not old:
                raise APIError(404 if loaded is None else 409,
                               f"nothing else serves {', '.join(map(repr, names))}: load it with POST "
                               "/admin/models/load", "served_model_name")
            if loaded is None:
                self._check_free(keys, replaced=old)  # the versions replaced may have the same key (v1 again)
                model = await self._build(req, names)
            else:
                model = loaded
                self.models.remove(model)
            for m in old:  # the old versions leave the tables, then the new one enters: in one step of the loop
                self._withdraw(m)
            self.add(model, make_default=True)
            results = await asyncio.gather(*(self._retire(m, req.drain_timeout_s) for m in old))
            return {"swapped": {"from": [m.label for m in old], "to": model.label},
                    "in_flight": sum(r["in_flight"] for r in results), "aborted": sum(r["aborted"] for r in results),
                    "loaded": model.describe(self.default_for(model))}

    async def _retire(self, model: ServedModel, timeout: float) -> dict:
        """Wait for the model's requests to finish (abort them after `timeout` s), then shut its engine down."""
        in_flight = model.in_flight()
        deadline = time.monotonic() + timeout
        while model.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        aborted = model.in_flight()
        if aborted:
            logger.warning("model %s: %d request(s) still running after %.0fs of draining: aborted", model.label,
                           aborted, timeout)
            model.serving.abort_all()
            model.async_engine.wake()
            # a handler still tokenizing will find the engine gone and answer 503
            for _ in range(250):
                if not model.async_engine.engine.request_ids():
                    break
                await asyncio.sleep(0.02)
        await asyncio.to_thread(model.async_engine.shutdown)
        self.retiring.remove(model)
        logger.info("model %s unloaded (%d request(s) running when it was switched off, %d aborted)", model.label,
                    in_flight, aborted)
        return {"in_flight": in_flight, "aborted": aborted}

    # -- the whole server --------------------------------------------------------------------------------------
    def everything(self) -> list[ServedModel]:
        return self.models + self.retiring

    def begin_shutdown(self) -> None:
        """No new requests on any model (503), as on SIGTERM."""
        self.draining = True
        for m in self.everything():
            m.serving.draining = True

    def abort_all(self) -> None:
        for m in self.everything():
            m.serving.abort_all()


class MergedMetrics:
    """One Prometheus exposition over every served model's registry (each model's series carry its model_name):
    families of one name become one, as the text format wants. `sources()`: (registry, family names to keep, or
    None for all), first ones first; a series found twice keeps the first."""

    def __init__(self, sources: Callable[[], list[tuple[CollectorRegistry, set[str] | None]]]):
        self.sources = sources
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self):
        families: dict[str, Metric] = {}
        seen = set()
        for registry, only in self.sources():
            for family in registry.collect():
                if only is not None and family.name not in only:
                    continue
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type,
                                                            family.unit)
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in seen:
                        seen.add(key)
                        merged.samples.append(sample)
        yield from families.values()
