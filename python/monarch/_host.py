"""The proc side of a Python actor (internal). monarch._native's PyActor calls into ActorHost.

Threads: ``handle``/``handle_send``/``supervise``/``cleanup`` run on a runtime worker thread
that holds the GIL, one message of an actor at a time. Sync endpoints run right there. Async
endpoints run on the proc's one asyncio loop (a thread of its own); those not marked
``@concurrent_endpoint`` take the actor's lock, in arrival order, so that they too run one at a
time. A concurrent ``def`` endpoint runs on a thread pool.

Wire format (also read by monarch.actor):
  request: cloudpickle of (args, kwargs, view, port), view = (labels, sizes) of the cast view
  reply:   b"\\x00" + pickle(value), or b"\\x01" + pickle((exception or None, traceback text,
           endpoint, actor))
"""

import asyncio
import concurrent.futures
import inspect
import pickle
import sys
import threading
import traceback
import weakref

from monarch import actor as _actor
from monarch.errors import MeshFailure

_VALUE = b"\x00"
_ERROR = b"\x01"


dumps = _actor._dumps  # every reply is a message (monarch.Tensor pickles only inside one)


def encode_value(value, endpoint="", actor=""):
    try:
        out = _VALUE + dumps(value)
    except Exception as e:  # an unpicklable result is the handler's error
        return encode_error(
            TypeError("endpoint %s returned a value that cannot be serialised: %s" % (endpoint, e)),
            endpoint, actor)
    if not _actor._fits_frame(len(out)):  # the channel would refuse it, naming C++
        return encode_error(
            ValueError("endpoint %s returned %d bytes, more than one message carries "
                       "(channel.max_frame_bytes is %d, less 64 KiB of headers): return it in "
                       "pieces, or through monarch.rdma.RDMABuffer"
                       % (endpoint, len(out), _actor._frame_limit())), endpoint, actor)
    return out


def encode_error(exc, endpoint="", actor=""):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        carried = pickle.loads(dumps(exc))  # only if it survives the trip
        body = dumps((carried, text, endpoint, actor))
    except Exception:
        body = dumps((None, text, endpoint, actor))
    return _ERROR + body


def is_error(reply):
    return reply[:1] == _ERROR


_LOOP = None
_LOOP_LOCK = threading.Lock()
_POOL = None


def loop():
    """The proc's asyncio loop (started on first use, on a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            lp = asyncio.new_event_loop()
            t = threading.Thread(target=lp.run_forever, name="monarch-asyncio", daemon=True)
            t.start()
            _LOOP = lp
        return _LOOP


def pool():
    global _POOL
    with _LOOP_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="monarch-concurrent")
        return _POOL


class InitError(Exception):
    """The actor class's ``__init__`` raised (the text names the class and holds the user's
    traceback), or its class and spawn arguments could not be unpickled here; PyActor::init
    makes the text the actor's failure cause."""


class ActorHost:
    def __init__(self, spec, rank, actor_id, name, me=None, set_label=None):
        self.me = me  # .fail(text) fails this actor
        self._owned = []  # meshes spawned in its handlers: stopped with it (own, stop_owned)
        self._owned_mu = threading.Lock()
        try:
            cls, args, kwargs = pickle.loads(spec)
        except BaseException as e:
            raise InitError("the class and spawn arguments of actor %r could not be unpickled in "
                            "this proc: %s: %s" % (name, type(e).__name__, e)) from None
        if set_label is not None:  # reports name this class, not the C++ PyActor
            set_label(cls.__qualname__)
        self.cls = cls
        self.endpoints = _actor._endpoints_of(cls)
        self.is_async = any(e.is_async for e in self.endpoints.values())
        self._lock = None
        # The response ports handed to explicit-response-port handlers and still alive: those
        # left unanswered when the actor stops are failed then (cleanup), not when the garbage
        # collector gets to them (a port kept in the actor's state lived until its proc ended,
        # and its caller waited that long). Handlers add from several threads: _ports_mu.
        self._ports = weakref.WeakSet()
        self._ports_mu = threading.Lock()
        rank_point = _actor._point_from_tuple(rank)
        self.instance_info = _actor.ActorInstance(actor_id, name, rank_point)
        self.instance_info._host = self
        token = _actor._current.set(_actor.Context(self.instance_info, rank_point))
        try:
            self.instance = cls.__new__(cls)
            self.instance._monarch_instance = self.instance_info
            try:
                self.instance.__init__(*args, **kwargs)
            except BaseException as e:  # the traceback from the class's own frame on
                tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
                raise InitError("%s.__init__ raised:\n%s" % (cls.__qualname__, "".join(
                    traceback.format_exception(type(e), e, tb)).rstrip())) from None
        finally:
            _actor._current.reset(token)

    # -- requests ---------------------------------------------------------------------------
    def _decode(self, method, payload, message_rank):
        ep = self.endpoints.get(method)
        if ep is None:
            raise AttributeError("actor %s (%s) has no endpoint %r" %
                                 (self.instance_info.actor_id, self.cls.__name__, method))
        args, kwargs, view, port = pickle.loads(payload)
        if kwargs and "_monarch_rref" in kwargs:  # endpoint.rref(...): result -> a tensor ref
            from monarch import tensor as _tensor
            ref = kwargs.pop("_monarch_rref")
            ep = _actor._EndpointSpec(_tensor._run_rref(ep.fn, ref), False, ep.concurrent)
        if view is not None and message_rank is not None:
            ctx = _actor.Context(self.instance_info, None, view, message_rank)
        else:
            ctx = _actor.Context(self.instance_info, self.instance_info.rank)
        return ep, args, kwargs, ctx, port

    def handle(self, method, payload, message_rank, reply):
        """A call: returns the encoded reply now, or None when ``reply`` will be answered."""
        if method == "__monarch_barrier__":  # stop()'s barrier: earlier casts have run
            if not self.is_async:
                return _VALUE + b"N."

            async def barrier():  # behind the async messages queued before it
                async with self._actor_lock():
                    reply.send(_VALUE + b"N.")
            asyncio.run_coroutine_threadsafe(barrier(), loop())
            return None
        label = "%s.%s" % (self.cls.__name__, method)
        try:
            ep, args, kwargs, ctx, _ = self._decode(method, payload, _rank(message_rank))
        except BaseException as e:
            return encode_error(e, label, self.instance_info.actor_id)
        port = None
        if ep.explicit_response_port:
            port = _actor._ResponsePort(reply, label, self.instance_info.actor_id)
            with self._ports_mu:
                self._ports.add(port)
            args = (port,) + tuple(args)
        if ep.is_async:
            self._schedule(ep, args, kwargs, ctx, reply, port, label, send=False)
            return None
        if ep.concurrent:
            pool().submit(self._run_sync_concurrent, ep, args, kwargs, ctx, reply, port, label)
            return None
        ctx._blocking = True  # this handler holds its actor: get() on its own reply deadlocks
        try:
            result = self._invoke(ctx, ep, args, kwargs)
        except BaseException as e:
            if self._fails_actor(e, label, reply):
                return None
            if port is not None:
                port._fail(e)
                return None
            return encode_error(e, label, self.instance_info.actor_id)
        if port is not None:
            return None
        return encode_value(result, label, self.instance_info.actor_id)

    def handle_send(self, method, payload, message_rank, reply):
        """A broadcast: a raising sync handler raises here, which fails the actor."""
        label = "%s.%s" % (self.cls.__name__, method)
        ep, args, kwargs, ctx, port = self._decode(method, payload, _rank(message_rank))
        if ep.explicit_response_port:
            args = (port if port is not None else _actor._NullPort(),) + tuple(args)
            port = None
        if ep.is_async:
            self._schedule(ep, args, kwargs, ctx, reply, port, label, send=True)
            return
        ctx._blocking = True
        try:
            result = self._invoke(ctx, ep, args, kwargs)
        except BaseException as e:
            raise RuntimeError(_broadcast_failure(label, e))
        if port is not None:
            port.send(result)

    def _fails_actor(self, e, label, reply):
        """Whether ``e``, raised by a call's handler, fails the actor instead of being the
        caller's error: it is not an ``Exception`` (SystemExit, KeyboardInterrupt, another
        BaseException), as in Monarch. The call ends with SupervisionError naming the actor
        and the error, and the actor is failed, which fails its proc (PY-5; not this_proc()'s,
        whose actors are in the client)."""
        if isinstance(e, (Exception, asyncio.CancelledError)) or self.me is None:
            return False  # a cancelled async handler (its actor stops) is no failure of it
        why = _broadcast_failure(label, e, "a %s (not an Exception) in a call" % type(e).__name__)
        reply.actor_failed(why, self.me)
        self.me.fail(why)
        return True

    def _invoke(self, ctx, ep, args, kwargs):
        """Runs a def endpoint with ``ctx`` as the current context."""
        token = _actor._current.set(ctx)
        try:
            return ep.fn(self.instance, *args, **kwargs)
        finally:
            _actor._current.reset(token)

    def _run_sync_concurrent(self, ep, args, kwargs, ctx, reply, port, label):
        try:
            result = self._invoke(ctx, ep, args, kwargs)
        except BaseException as e:
            if self._fails_actor(e, label, reply):
                return
            if port is not None:
                port._fail(e)
            else:
                reply.send(encode_error(e, label, self.instance_info.actor_id))
            return
        if port is None:
            reply.send(encode_value(result, label, self.instance_info.actor_id))

    def _schedule(self, ep, args, kwargs, ctx, reply, port, label, send):
        async def run():
            _actor._current.set(ctx)
            lock = None if ep.concurrent else self._actor_lock()
            if lock is not None:
                await lock.acquire()
            try:
                try:
                    result = await ep.fn(self.instance, *args, **kwargs)
                except BaseException as e:
                    if send:
                        reply.fail(_broadcast_failure(label, e))
                    elif self._fails_actor(e, label, reply):
                        pass
                    elif port is not None:
                        port._fail(e)
                    else:
                        reply.send(encode_error(e, label, self.instance_info.actor_id))
                    return
                if send:
                    if port is not None:
                        port.send(result)
                elif port is None or not ep.explicit_response_port:
                    reply.send(encode_value(result, label, self.instance_info.actor_id))
            finally:
                if lock is not None:
                    lock.release()

        asyncio.run_coroutine_threadsafe(run(), loop())

    def _actor_lock(self):
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # -- supervision and stop ------------------------------------------------------------------
    def _run_hook(self, fn, *args):
        token = _actor._current.set(_actor.Context(self.instance_info, self.instance_info.rank))
        try:
            r = fn(*args)
        finally:
            _actor._current.reset(token)
        if inspect.isawaitable(r):
            async def wrap():
                _actor._current.set(_actor.Context(self.instance_info, self.instance_info.rank))
                return await r
            r = asyncio.run_coroutine_threadsafe(wrap(), loop()).result()
        return r

    def supervise(self, mesh, ranks, cause, text):
        fn = getattr(self.instance, "__supervise__", None)
        if fn is None:
            return False
        return bool(self._run_hook(fn, MeshFailure(mesh, ranks, cause, text)))

    def undeliverable(self, dest, reason, text):
        """PyActor::undeliverable: True when the actor's hook handled the report."""
        fn = getattr(self.instance, "_handle_undeliverable_message", None)
        if fn is None:
            return False
        envelope = _actor.UndeliverableMessageEnvelope(
            self.instance_info.actor_id, dest, reason, text)
        return bool(self._run_hook(fn, envelope))

    def owned_failure(self, mesh, ranks, cause, text):
        """A failure of procs this actor spawned off its own thread (in an async endpoint): as
        PyActor::supervise would, __supervise__ decides; unhandled, it fails this actor."""
        try:
            handled = self.supervise(mesh, ranks, cause, text)
        except BaseException as e:
            handled = False
            text = "%s\n__supervise__ raised: %r" % (text, e)
        if not handled and self.me is not None:
            self.me.fail("unhandled failure of procs it spawned: " + text)
        return True

    def own(self, mesh):
        """A ProcMesh or ActorMesh spawned in this actor's handlers (or __init__): this actor
        owns it (any thread)."""
        with self._owned_mu:
            self._owned = [m for m in self._owned if m._live.stopped is None]
            self._owned.append(mesh)

    def stop_owned(self, why):
        """Stops the meshes this actor spawned and waits for them: its actor meshes all at
        once, then its proc meshes all at once (so their stops overlap, rather than adding up
        against the owner's own mesh.stop_timeout). A stop that fails is written to stderr: the
        owner's own stop goes on."""
        with self._owned_mu:
            owned, self._owned = self._owned, []
        def failed(mesh, e):
            sys.stderr.write("monarch: %s: stopping %r, which it owns: %s\n"
                             % (self.instance_info.actor_id, mesh, e))

        for wave in ([m for m in owned if isinstance(m, _actor.ActorMesh)],
                     [m for m in owned if not isinstance(m, _actor.ActorMesh)]):
            stops = []
            for mesh in wave:
                try:
                    stops.append((mesh, mesh.stop(why)))
                except BaseException as e:
                    failed(mesh, e)
            for mesh, f in stops:
                try:
                    f.get()
                except BaseException as e:
                    failed(mesh, e)

    def cleanup(self, error):
        """PyActor::cleanup, once, on the actor's worker: stops the meshes the actor spawned
        (Monarch's recursive stop), runs ``__cleanup__``, then fails every response port still
        unanswered (its caller gets ActorError naming the endpoint)."""
        fn = getattr(self.instance, "__cleanup__", None)
        self.stop_owned("its owner %s %s" % (self.instance_info.actor_id,
                                              "stopped" if error is None else "failed"))
        try:
            if fn is not None:
                self._run_hook(fn, None if error is None else _actor.ActorError(error))
        finally:
            with self._ports_mu:
                left = [p for p in self._ports if not p._answered]
                self._ports = weakref.WeakSet()
            for p in left:
                p._fail(RuntimeError("actor %s stopped before endpoint %s answered its response "
                                     "port" % (self.instance_info.actor_id, p._label)))


def _broadcast_failure(label, e, how="in a broadcast"):
    """What fails an actor whose handler raised: the endpoint and the traceback."""
    return "endpoint %s raised %s:\n%s" % (
        label, how, "".join(traceback.format_exception(type(e), e, e.__traceback__)))


def _rank(r):
    return None if r is None or r >= 2**63 else r


_REDUCERS = {}


def reduce_pair(fn, a, b):
    """One combine of the cast tree: errors win (the first one), values combine with fn."""
    if is_error(a):
        return a
    if is_error(b):
        return b
    f = _REDUCERS.get(fn)
    if f is None:
        f = pickle.loads(fn)
        if len(_REDUCERS) > 64:
            _REDUCERS.clear()
        _REDUCERS[fn] = f
    try:
        return encode_value(f(pickle.loads(a[1:]), pickle.loads(b[1:])), "reducer")
    except BaseException as e:
        return encode_error(e, "reducer")  # no actor: the caller names the endpoint
