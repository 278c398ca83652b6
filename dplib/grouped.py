"""Run one estimator per group (``group_by``) with one backend call per stage for all groups.

An estimator asks the seam (:class:`dplib.seam.Aggregates`) one question at a time, and each
question depends on the DP answers to the earlier ones. Per group, the questions are the same
estimator's; across groups they differ only in their numeric parameters (a group's centre, its
radius). :func:`run_per_group` runs the estimator of every group in its own greenlet (a
cooperative coroutine: no threads, no replays), each against a :class:`GroupProxy` that hands
its question to the scheduler and waits. When every group waits or is done, the scheduler
answers all waiting questions of the same method (and the same static arguments: columns, hash
range, sub-edges) with one batched call of the backend (:class:`GroupedAggregates`: one Spark
aggregation grouped by group id, or the numpy twin), then resumes each group with its answer.
So ``G`` groups cost as many backend calls as one group has stages, not ``G`` times that, and
the estimators run unchanged.

Noise, budgets and mechanisms are the estimator's as usual: each group charges its accountant and
then draws its noise on the driver, in its own greenlet. A group drawing through
:class:`GroupedNoise` waits like a question, and the scheduler draws every waiting group's values of
one (source, distribution, scale) in one call of that source (independent noise per value, the same mechanism as one call per group; the
secure source's per-call cost dominated 10^5 groups' run), concatenated in the order of ``gids``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence

import numpy as np
from greenlet import greenlet

from dplib.errors import InvalidParameterError
from dplib.mechanisms.noise import _check_scale, _check_values

log = logging.getLogger("person_dp.grouped")

#: The seam methods a group may ask (:class:`dplib.seam.Aggregates`), with the positional
#: parameters that may differ between groups (numbers) and those batched together only when equal.
PER_GROUP_PARAMETERS: dict[str, tuple[str, ...]] = {
    "count": (),
    "histogram": ("bin_width", "offset", "clamp"),
    "histograms": ("bin_widths", "offsets"),
    "log_histogram": ("center",),
    "log_histograms": ("centers",),
    "norm_log_histogram": ("center", "scales"),
    "clipped_sum": ("center", "radius", "scales"),
    "clipped_sum_split": ("center", "radius"),
    "clipped_outer_sum": ("center", "radius", "scales"),
}

#: Parameter names of each method in order (after ``self``), as in :class:`dplib.seam.Aggregates`.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "count": ("columns", "group"),
    "histogram": ("column", "bin_width", "offset", "group", "clamp"),
    "histograms": ("columns", "bin_widths", "offsets", "group"),
    "log_histogram": ("column", "center", "group", "sub_edges"),
    "log_histograms": ("columns", "centers", "group", "sub_edges"),
    "norm_log_histogram": ("columns", "center", "scales", "group", "sub_edges"),
    "clipped_sum": ("columns", "center", "radius", "group", "scales"),
    "clipped_sum_split": ("column", "center", "radius", "group"),
    "clipped_outer_sum": ("columns", "center", "radius", "group", "scales"),
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "histogram": {"clamp": None},
    "log_histogram": {"sub_edges": ()},
    "log_histograms": {"sub_edges": ()},
    "norm_log_histogram": {"sub_edges": ()},
    "clipped_sum": {"scales": None},
    "clipped_outer_sum": {"scales": None},
}


def bind(method: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name (defaults filled in), or InvalidParameterError."""
    names = SIGNATURES.get(method)
    if names is None:
        raise InvalidParameterError(f"grouped statistics cannot ask {method!r} of the seam")
    if len(args) > len(names):
        raise InvalidParameterError(f"{method}: too many arguments")
    out = dict(DEFAULTS.get(method, {}))
    out.update(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise InvalidParameterError(f"{method}: unknown argument {k!r}")
        out[k] = v
    missing = [n for n in names if n not in out]
    if missing:
        raise InvalidParameterError(f"{method}: missing {missing}")
    return out


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return tuple(v.tolist())
    return v


@dataclass(frozen=True)
class Request:
    """One group's waiting question: the seam method and its arguments by name."""

    gid: Hashable
    method: str
    arguments: dict[str, Any]

    def batch_key(self) -> tuple:
        """Questions with the same key are answered by one backend call: same method and the
        same values of every argument that is not a per-group parameter."""
        per = PER_GROUP_PARAMETERS[self.method]
        return (self.method,) + tuple(
            (k, _freeze(v)) for k, v in sorted(self.arguments.items()) if k not in per
        )


@dataclass(frozen=True)
class JointRequest:
    """One group's part of a **joint stage**: a question answered from every asking group's
    payload at once (e.g. one noisy histogram pooled over the groups, its noise drawn once on the
    driver), by the ``joint`` handler of :func:`run_per_group` named ``name``. Answered only when
    no group waits on an ordinary seam question, so every group that will ask has asked."""

    gid: Hashable
    name: str
    payload: Any


@dataclass(frozen=True)
class NoiseRequest:
    """One group's waiting draw: ``values`` (already checked finite) plus noise of ``kind``
    ("laplace" or "gaussian") at ``scale`` (already checked finite and > 0)."""

    gid: Hashable
    kind: str
    values: np.ndarray = field(repr=False)  # exact: never in a repr
    scale: float
    source: Any = field(repr=False)  # the real source the group's GroupedNoise wraps


class GroupedNoise:
    """A noise source for the estimators of :func:`run_per_group`: inside a group's greenlet a draw
    waits for the scheduler (which draws all waiting groups' values of one kind and scale with one
    call of ``source``); anywhere else it is ``source`` itself. Bad values or scales raise here, in
    the group that asked, as ``source`` would."""

    def __init__(self, source) -> None:
        self._source = source
        self.name = source.name
        self.secure = source.secure

    def _draw(self, kind: str, values, scale: float, check_name: str) -> np.ndarray:
        scale = _check_scale(scale, check_name)
        arr = _check_values(values)
        cur = greenlet.getcurrent()
        if not getattr(cur, "_dp_group", False):
            return getattr(self._source, f"add_{kind}")(arr, scale)
        # a copy: the draw happens after other groups have run
        return cur.parent.switch(NoiseRequest(cur._dp_group_id, kind, np.array(arr, dtype=np.float64), scale,
                                              self._source)).value

    def add_laplace(self, values, scale: float) -> np.ndarray:
        return self._draw("laplace", values, scale, "Laplace scale")

    def add_gaussian(self, values, sigma: float) -> np.ndarray:
        return self._draw("gaussian", values, sigma, "Gaussian sigma")

    def __getattr__(self, name: str):
        # anything else of the source (a seeded source's ``rng``, read by the exponential
        # mechanism's test sampler), drawn from directly
        if name.startswith("__") or name == "_source":
            raise AttributeError(name)
        return getattr(self._source, name)


def _draw_batched(requests: list[NoiseRequest]) -> dict:
    """``{gid: noised values}``: one call of each request's source per (source, kind, scale), the
    requests' values concatenated in the given order and split back (each keeps its shape)."""
    by_key: dict[tuple[int, str, float], list[NoiseRequest]] = {}
    for r in requests:
        by_key.setdefault((id(r.source), r.kind, r.scale), []).append(r)
    out = {}
    for (_, kind, scale), reqs in by_key.items():
        flat = np.concatenate([r.values.ravel() for r in reqs])
        noised = getattr(reqs[0].source, f"add_{kind}")(flat, scale)
        at = 0
        for r in reqs:
            n = r.values.size
            out[r.gid] = noised[at:at + n].reshape(r.values.shape)
            at += n
    return out


class GroupedAggregates(Protocol):
    """Answers one batch of same-method questions, one per group (Spark: one aggregation)."""

    def answer(self, method: str, static: Mapping[str, Any], per_group: Mapping[Hashable, Mapping[str, Any]]) -> dict:
        """``{gid: answer}`` for each gid of ``per_group`` (its per-group arguments), with the
        shared ``static`` arguments; each answer as the ungrouped seam method returns it."""
        ...


class GroupProxy:
    """The seam as one group's estimator sees it: every call waits for the scheduler's batch."""

    def __init__(self, gid: Hashable, columns: Sequence[str] | None = None) -> None:
        self._gid = gid
        self._columns = None if columns is None else list(columns)

    def check_columns(self, columns: Sequence[str]) -> None:
        if self._columns is not None:
            for c in columns:
                if c not in self._columns:
                    raise InvalidParameterError(f"unknown column {c!r}; the summaries hold {self._columns}")

    def __getattr__(self, method: str):
        if method not in SIGNATURES:
            raise AttributeError(method)

        def call(*args, **kwargs):
            request = Request(self._gid, method, bind(method, args, kwargs))
            parent = greenlet.getcurrent().parent
            if parent is None:
                raise InvalidParameterError("a GroupProxy is only usable inside run_per_group")
            return parent.switch(request).value

        return call

    def joint(self, name: str, payload: Any) -> Any:
        """Ask the joint stage ``name`` with this group's ``payload``; returns this group's part of
        the handler's answer (:class:`JointRequest`)."""
        parent = greenlet.getcurrent().parent
        if parent is None:
            raise InvalidParameterError("a GroupProxy is only usable inside run_per_group")
        return parent.switch(JointRequest(self._gid, name, payload)).value


class NumpyGroupedAggregates:
    """The numpy twin of :class:`GroupedAggregates`: one :class:`dplib.aggregates.NumpyAggregates`
    (or any ungrouped backend) per group, each asked in turn."""

    def __init__(self, backends: Mapping[Hashable, Any]) -> None:
        self._backends = dict(backends)
        self.calls = 0

    def answer(self, method, static, per_group):
        self.calls += 1
        return {gid: getattr(self._backends[gid], method)(**static, **args) for gid, args in per_group.items()}


@dataclass
class GroupedRun:
    """What :func:`run_per_group` returns: each group's result, and the backend calls made."""

    results: dict
    batches: int


def run_per_group(
    gids: Sequence[Hashable],
    body: Callable[[Hashable, GroupProxy], Any],
    backend: GroupedAggregates,
    columns: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    joint: Mapping[str, Callable[[dict], dict]] | None = None,
) -> GroupedRun:
    """Run ``body(gid, proxy)`` for every group, answering their seam questions in batches.

    Parameters
    ----------
    gids : sequence of hashable
        The groups, in the (public) order their noise is drawn.
    body : callable
        One group's estimator run; its questions go to the proxy it is given.
    backend : GroupedAggregates
        Answers a batch of same-method questions, one per group.
    columns : sequence of str, optional
        The summary's columns (for the proxy's ``check_columns``).
    progress : callable, optional
        Receives a progress line after each batch (groups done / waiting); public numbers only.
    joint : mapping name -> callable, optional
        Joint stages (:meth:`GroupProxy.joint`): ``handler({gid: payload}) -> {gid: answer}`` for
        the groups that asked, called once per run, when only joint questions wait (the groups'
        payloads in their ``gids`` order); a group asking it again after that is an error. A
        handler draws any noise itself, once.

    Returns
    -------
    GroupedRun

    Raises
    ------
    Whatever a group's ``body`` raises (the run stops: nothing is returned, nothing written).
    """
    if len(set(gids)) != len(gids):
        raise InvalidParameterError("group ids must be distinct")
    results: dict = {}
    waiting: dict[Hashable, tuple[greenlet, Request | JointRequest]] = {}
    drawing: dict[Hashable, tuple[greenlet, NoiseRequest]] = {}

    order = {g: i for i, g in enumerate(gids)}

    joint = dict(joint or {})
    answered: set[str] = set()

    def step(gid, glet, answer=None):
        out = glet.switch() if answer is None else glet.switch(answer)
        if isinstance(out, NoiseRequest):
            drawing[gid] = (glet, out)
        elif isinstance(out, JointRequest):
            if out.name not in joint:
                raise InvalidParameterError(f"group {gid!r}: no joint stage named {out.name!r}")
            waiting[gid] = (glet, out)
        elif isinstance(out, Request):
            waiting[gid] = (glet, out)
        elif glet.dead:
            results[gid] = out
        else:  # pragma: no cover - a body switching to the parent with something else
            raise InvalidParameterError(f"group {gid!r}: the estimator yielded {type(out).__name__}")

    def draw_waiting() -> None:
        # every waiting draw, batched per kind and scale, in the order of gids; a resumed group may
        # draw again (or ask a question): repeat until no group waits on noise
        while drawing:
            reqs = sorted((r for _, r in drawing.values()), key=lambda r: order[r.gid])
            noised = _draw_batched(reqs)
            for r in reqs:
                glet, _ = drawing.pop(r.gid)
                step(r.gid, glet, _Answer(noised[r.gid]))

    for gid in gids:
        g = greenlet(lambda gid=gid: body(gid, GroupProxy(gid, columns)))
        g._dp_group, g._dp_group_id = True, gid
        step(gid, g)
    batches = 0
    t0 = time.monotonic()
    draw_waiting()
    while waiting:
        if all(isinstance(r, JointRequest) for _, r in waiting.values()):
            # every group still running waits on a joint stage: answer the first one named
            # (in the order of the earliest waiting group), all its groups at once
            joints = {g: r for g, (_, r) in waiting.items() if isinstance(r, JointRequest)}
            name = joints[min(joints, key=lambda g: order[g])].name
            if name in answered:  # a handler may charge a budget: once per run, never a second round
                raise InvalidParameterError(f"joint stage {name!r} asked again after it was answered")
            answered.add(name)
            asking = sorted((g for g, r in joints.items() if r.name == name), key=lambda g: order[g])
            answers = joint[name]({g: joints[g].payload for g in asking})
            batches += 1
            for g in asking:
                glet, _ = waiting.pop(g)
                step(g, glet, _Answer(answers[g]))
            draw_waiting()
            if progress is not None:
                progress(f"joint stage {name} ({len(asking)} groups): {len(results)}/{len(gids)} groups done "
                         f"({time.monotonic() - t0:.0f}s)")
            continue
        by_key: dict[tuple, list[Request]] = {}
        for _, req in waiting.values():
            if isinstance(req, Request):
                by_key.setdefault(req.batch_key(), []).append(req)
        # one batch at a time, in a fixed order: the batch holding the earliest group first
        key = min(by_key, key=lambda k: min(order[r.gid] for r in by_key[k]))
        reqs = by_key[key]
        method = reqs[0].method
        per = PER_GROUP_PARAMETERS[method]
        static = {k: v for k, v in reqs[0].arguments.items() if k not in per}
        per_group = {r.gid: {k: v for k, v in r.arguments.items() if k in per} for r in reqs}
        answers = backend.answer(method, static, per_group)
        batches += 1
        for r in sorted(reqs, key=lambda r: order[r.gid]):
            glet, _ = waiting.pop(r.gid)
            step(r.gid, glet, _Answer(answers[r.gid]))
        draw_waiting()
        if progress is not None:
            progress(f"batch {batches} ({method}, {len(reqs)} groups): {len(results)}/{len(gids)} groups done "
                     f"({time.monotonic() - t0:.0f}s)")
    return GroupedRun({gid: results[gid] for gid in gids}, batches)


class _Answer:
    """An answer in transit (so that an answer of ``None`` or 0 still resumes the group)."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value
