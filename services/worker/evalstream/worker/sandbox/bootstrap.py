"""Runs first inside each code sandbox (process.py), as `python -I -S -c <this file's text>
<payload fd> <status fd> <AS bytes> <FSIZE bytes> <CPU seconds> <open files> <threads>
<uid to drop to, 0: none> <early-exit code> <candidate-gone code> <lib-dynload dir> <role>`. The worker never imports it:
it reads this file as text. Standard library only.

The payload (JSON: a role and what it needs) comes through an inherited memfd: not argv
(size limits), not stdin (left to the program). The status fd gets one byte once the sandbox
stood up (the uid dropped, rlimits set, the hook armed: anything failing before is the
worker's fault). Then one of three roles runs, in a thread of its own (the main thread only
waits: signal handlers, which would receive its frame, cannot be installed elsewhere):

* judge (a graded run's first sandbox): runs the task's helpers (its prompt) and its tests,
  and calls `check(<entry point>)` with a stand-in for the entry point that sends each
  call's arguments to the candidate's sandbox and reads back its answer. No candidate code
  ever runs here: what comes back is decoded as data of the plain types alone (bool, int,
  float, complex, str, bytes, None, and lists, tuples, dicts, sets and frozensets of them),
  never unpickled or evaluated, so an object whose __eq__ always answers True cannot exist
  in this interpreter. A pass is this process writing the run's nonce on its status fd
  after `check` returned. The nonce exists in this process only (and in the worker).
* candidate (a graded run's second sandbox, a process of its own in a bubblewrap of its
  own: other pid, mount, network and IPC namespaces, another uid): runs the candidate's
  program, says "ready", then answers calls: arguments in, the entry point's return value
  or its exception (type name and message) out. It holds no secret: the tests, their
  expected values and the nonce never enter it, so no object graph it can walk (frames,
  garbage the collector hands back, tracebacks, weakref callbacks, subclasses, modules)
  holds anything worth finding. Whatever it writes, on any fd, is at most an answer to a
  call: the judge alone decides. If it ends (or stops reading), the judge ends at once
  with the candidate-gone code (an os._exit, which no test can catch), saying nothing, so that the candidate's own last
  words (its traceback, "program called exit()") are what the host reads as the reason.
* program (a plain run, no tests: `run_program(source)`): runs the program and, once it ran
  to its end, writes the run's nonce on the status fd. This pass is the program's own word,
  guarded only by the audit hook below, because nothing else judges a plain program: a
  program that walks frames could forge it. Grading never relies on it (graded runs use the
  judge); the worker uses it to check that the sandbox runs at all.

An audit hook, armed before any candidate code runs, is a second layer in every role: it
refuses every way to reach a frame or foreign objects (sys._getframe, sys._current_frames,
tb_frame/gi_frame/cr_frame/ag_frame, gc.get_objects/get_referrers/get_referents,
settrace/setprofile), raw memory (ctypes, the _test* modules, extension modules from outside
lib-dynload), hand-made bytecode (code.__new__, marshal), exec and new audit hooks. /proc is
not mounted. In the program role, everything used after the program ran was captured before
(builtins, modules and their attributes can all be rewritten by that code): hence the
unusual style below, no helper module, no builtin looked up late.

The judge's tests see the task's helpers (run on their own: the candidate cannot redefine
them), less any name shadowing a builtin, the stand-in for the entry point and builtins of
their own. A test that passes the candidate a value of another type (a function, an object)
fails with a TypeError: nothing but plain data crosses between the two sandboxes, in either
direction. Arguments a call mutates are not copied back.

Tracebacks are printed by the interpreter's C printer (sys.__excepthook__), which needs no
frame access from Python; source lines are added by the host, which has the program.
"""

from typing import Any


def _bootstrap():
    import _thread
    import builtins
    import json
    import os
    import resource
    import sys

    del globals()["_bootstrap"]
    (payload_fd, status_fd, mem, fsize, cpu, nofile, nproc, uid, early_exit, gone_exit) = (
        int(a) for a in sys.argv[1:11]
    )
    dynload = os.path.normpath(sys.argv[11]) + os.sep
    role = sys.argv[12]  # judge, candidate or program
    judging = role == "judge"
    if uid:  # the worker is root: leave root (and every capability) for good
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    for res, soft, hard in (
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_NOFILE, nofile, nofile),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
    ):
        resource.setrlimit(res, (soft, hard))
    # what HumanEval programs commonly import, loaded now: once armed, modules compile from
    # source (marshal is refused, so is every .pyc). The judge runs no candidate code, so it
    # may read the standard library's .pyc files and imports only what the tests need.
    for name in (
        ()
        if judging
        else (
            "typing",
            "math",
            "re",
            "collections",
            "itertools",
            "functools",
            "heapq",
            "bisect",
            "string",
            "hashlib",
            "random",
            "copy",
        )
    ):
        __import__(name)
    write, read, close, exit_now, compile_, exec_, type_ = (
        os.write,
        os.read,
        os.close,
        os._exit,
        compile,
        exec,
        type,
    )
    stdout, stderr, excepthook = sys.stdout, sys.stderr, sys.__excepthook__
    saved_builtins = dict(builtins.__dict__)
    loads, dumps, normpath, repr_, len_ = json.loads, json.dumps, os.path.normpath, repr, len
    frozen, bool_, int_, float_, str_ = frozenset, bool, int, float, str
    list_, tuple_, dict_, set_, complex_, bytes_ = list, tuple, dict, set, complex, bytes
    bytearray_, isinstance_, base_exception = bytearray, isinstance, BaseException

    # hand-made code objects from marshal data: refused where candidate code runs (the
    # judge reads the standard library's .pyc files, and runs only the task's own code)
    unmarshal = frozen(() if judging else ("marshal.loads", "marshal.load"))
    denied_events = unmarshal | frozen(
        (
            "sys._getframe",
            "sys._current_frames",
            "sys._current_exceptions",
            "sys.settrace",
            "sys.setprofile",
            "sys.addaudithook",
            "sys.monitoring.register_callback",
            "gc.get_objects",
            "gc.get_referrers",
            "gc.get_referents",
            "code.__new__",
            "os.exec",
            "ctypes.dlopen",
            "ctypes.dlsym",
            "ctypes.cdata",
            "ctypes.addressof",
            "ctypes.string_at",
            "ctypes.call_function",
        )
    )
    denied_attrs = frozen(
        ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals", "f_builtins")
    )
    denied_modules = frozen(
        ("ctypes", "_ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_posixshmem", "_multiprocessing")
    )
    denied_error, import_error, value_error, type_error = PermissionError, ImportError, ValueError, TypeError

    def audit(event, args):
        if event in denied_events:
            if event == "sys._getframe":  # what the standard library expects when frames are missing
                raise value_error("sys._getframe is not available in the sandbox")
            raise denied_error(event + " is not allowed in the sandbox")
        if event == "object.__getattr__" and args[1] in denied_attrs:
            raise denied_error(args[1] + " is not readable in the sandbox")  # a C string: exact str
        if event == "import":
            name, filename = args[0], args[1]
            # exact str only: a str subclass could answer startswith/normpath as it likes
            if type_(name) is not str_ or (filename is not None and type_(filename) is not str_):
                raise import_error("module names and paths must be plain strings in the sandbox")
            if name in denied_modules or name.startswith(("_test", "_ctypes", "_xx")):
                raise import_error("module " + str_(name) + " is not available in the sandbox")
            if filename is not None and not normpath(filename).startswith(dynload):
                raise import_error("extension modules load only from the standard library")

    if not judging:
        sys.pycache_prefix = "/nonexistent"  # no .pyc is read (marshal is refused)
    sys.dont_write_bytecode = True
    sys.addaudithook(audit)

    def flush():
        for stream in (stdout, stderr):
            try:  # noqa: SIM105 (contextlib may have been rewritten by the program)
                stream.flush()
            except base_exception:
                pass

    def report(e):
        """Prints `e` with the C printer (no frame access), less this bootstrap's frame."""
        flush()
        tb = e.__traceback__
        if tb is not None:
            tb = e.__traceback__ = tb.tb_next  # not this frame (the printer reads the exception's)
        excepthook(type_(e), e, tb)
        flush()

    def exited(e):
        stderr.write("program called exit(" + repr_(e.code)[:100] + ") before it finished\n")
        flush()
        exit_now(early_exit)

    # --- plain data across the two sandboxes: JSON, every non-JSON type tagged -----------------
    # One JSON array per line: ["ready"], ["call", args, [[name, value], ...]], ["value", v],
    # ["error", type name, message]. In values, lists and the JSON scalars stand for
    # themselves; every other type is an object of one key: {"t": tuple}, {"s": set},
    # {"f": frozenset}, {"d": [[k, v], ...]}, {"c": [real, imag]}, {"b": bytes hex},
    # {"a": bytearray hex}, {"x": int hex} (an int beyond 2**53: hex is linear both ways and
    # outside the int-to-decimal digit limit). Decoding builds these types and nothing else.
    big = 1 << 53

    def encode(value, depth, exact):
        """`exact`: the candidate's answers, whose types must be exactly the plain ones (a
        subclass could behave as it likes); else the tests' arguments, taken by their base."""
        if depth > 32:
            raise type_error("nested more than 32 deep")
        kind = type_(value)
        if value is None or kind is bool_:
            return value
        test = (lambda t: kind is t) if exact else (lambda t: isinstance_(value, t))
        if test(bool_):
            return bool_(value)
        if test(int_):
            return int_(value) if -big < value < big else {"x": int_.__format__(int_(value), "x")}
        if test(float_):
            return float_(value)
        if test(str_):
            return str_(value)
        if test(list_):
            return [encode(v, depth + 1, exact) for v in value]
        if test(tuple_):
            return {"t": [encode(v, depth + 1, exact) for v in value]}
        if test(frozen):
            return {"f": [encode(v, depth + 1, exact) for v in value]}
        if test(set_):
            return {"s": [encode(v, depth + 1, exact) for v in value]}
        if test(dict_):
            return {
                "d": [[encode(k, depth + 1, exact), encode(v, depth + 1, exact)] for k, v in value.items()]
            }
        if test(complex_):
            return {"c": [float_(value.real), float_(value.imag)]}
        if test(bytes_):
            return {"b": bytes_(value).hex()}
        if not exact and isinstance_(value, bytearray_):
            return {"a": bytes_(value).hex()}
        raise type_error(kind.__qualname__)

    def untag(obj):
        if len_(obj) != 1:
            raise value_error("not a tagged value")
        ((tag, value),) = obj.items()
        if tag == "x" and type_(value) is str_:
            return int_(value, 16)
        if tag in ("b", "a") and type_(value) is str_:
            return (bytes_ if tag == "b" else bytearray_).fromhex(value)
        if type_(value) is not list_:
            raise value_error("not a tagged value")
        if tag == "t":
            return tuple_(value)
        if tag == "s":
            return set_(value)
        if tag == "f":
            return frozen(value)
        if tag == "d":
            if not all(type_(p) is list_ and len_(p) == 2 for p in value):
                raise value_error("not a tagged value")
            return dict_(value)
        if tag == "c" and len_(value) == 2 and all(type_(v) in (int_, float_) for v in value):
            return complex_(value[0], value[1])
        raise value_error("not a tagged value")

    def decode(line):
        return loads(line, object_hook=untag)

    limit = 16 << 20  # one message's size either way

    def send(fd, message):
        data = (dumps(message, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[write(fd, data) :]

    def receiver(fd):
        """A function returning the next line read from `fd` (None at its end)."""
        pending = bytearray_()

        def next_line():
            while True:
                end = pending.find(b"\n")
                if end >= 0:
                    line = bytes_(pending[:end])
                    del pending[: end + 1]
                    return line
                if len_(pending) > limit:
                    raise value_error("a message longer than " + str_(limit) + " bytes")
                chunk = read(fd, 1 << 16)
                if not chunk:
                    return None
                pending.extend(chunk)

        return next_line

    # --- the roles -------------------------------------------------------------------------
    def program(payload):
        nonce = payload["nonce"].encode()
        source = payload["program"]
        del payload
        try:
            exec_(
                compile_(source, "<candidate>", "exec"),
                {"__name__": "__candidate__", "__builtins__": builtins},
            )
        except SystemExit as e:
            exited(e)
        except base_exception as e:
            try:
                report(e)
            finally:
                exit_now(1)
        try:
            flush()
        finally:
            write(status_fd, nonce)
            exit_now(0)

    def candidate(payload):
        close(status_fd)  # nothing more to say there: the judge decides
        requests, replies = payload["requests"], payload["replies"]
        source, entry = payload["program"], payload["entry_point"]
        del payload
        namespace: dict[str, Any] = {"__name__": "__candidate__", "__builtins__": builtins}
        try:
            exec_(compile_(source, "<candidate>", "exec"), namespace)
            if entry not in namespace:
                raise NameError("name " + repr_(entry) + " is not defined")
            function = namespace[entry]
        except SystemExit as e:
            exited(e)
        except base_exception as e:
            try:
                report(e)
            finally:
                exit_now(1)
        send(replies, ["ready"])
        next_request = receiver(requests)
        while True:
            line = next_request()
            if line is None:  # the judge is done
                flush()
                exit_now(0)
            _, args, kwargs = decode(line)
            try:
                value = function(*args, **dict_(kwargs))
                try:
                    reply = ["value", encode(value, 0, True)]
                except (TypeError, ValueError) as e:
                    raise type_error(
                        "the entry point returned a "
                        + type_(value).__qualname__
                        + ", not a plain value (bool, int, float, str, None or a list, "
                        "tuple, dict or set of them): " + str_(e)[:200]
                    ) from None
            except SystemExit as e:
                exited(e)
            except base_exception as e:
                report(e)
                reply = ["error", type_(e).__name__[:100], str_(e)[:1000]]
            flush()
            send(replies, reply)

    def judge(payload):
        nonce = payload["nonce"].encode()
        requests, replies = payload["requests"], payload["replies"]
        tests, entry = payload["tests"], payload["entry_point"]
        helpers = None  # the task's own definitions, as the tests should see them
        if payload["helpers"] is not None:
            helpers = {"__name__": "__helpers__", "__builtins__": dict_(saved_builtins)}
            try:  # a prompt that cannot run alone has none
                exec_(compile_(payload["helpers"], "<prompt>", "exec"), helpers)
            except Exception:
                helpers = None
        errors = {
            name: kind
            for name, kind in saved_builtins.items()
            if isinstance_(kind, type_) and issubclass(kind, Exception)
        }
        next_reply = receiver(replies)
        lock = _thread.allocate_lock()

        def answer():
            """The candidate's next message; its end ends this process, uncatchably."""
            try:
                line = next_reply()
                if line is None:
                    gone()
                return decode(line)
            except Exception as e:
                stderr.write(
                    "the candidate's process broke the protocol: "
                    + type_(e).__name__
                    + ": "
                    + str_(e)[:200]
                    + "\n"
                )
                flush()
                exit_now(1)

        def gone():
            """The candidate's process ended (or stopped reading): this one ends too, silently."""
            flush()
            exit_now(gone_exit)

        def entry_point(*args, **kwargs):
            call = [
                "call",
                [encode(a, 0, False) for a in args],
                [[str_(k), encode(v, 0, False)] for k, v in kwargs.items()],
            ]
            with lock:
                try:
                    send(requests, call)
                except OSError:  # no reader left (EPIPE): never an exception a test could catch
                    gone()
                reply = answer()
            if type_(reply) is list_ and len_(reply) == 2 and reply[0] == "value":
                return reply[1]
            if type_(reply) is list_ and len_(reply) == 3 and reply[0] == "error":
                _, name, message = reply
                if type_(name) is str_ and type_(message) is str_:
                    kind = errors.get(name)
                    try:
                        e = kind(message) if kind is not None else RuntimeError(name + ": " + message)
                    except Exception:
                        e = RuntimeError(name + ": " + message)
                    raise e
            stderr.write("the candidate's process broke the protocol: an unknown reply\n")
            flush()
            exit_now(1)

        entry_point.__name__ = entry_point.__qualname__ = entry
        try:
            if answer() != ["ready"]:  # its program ran (or it ended: gone)
                stderr.write("the candidate's process broke the protocol: no ready\n")
                flush()
                exit_now(1)
            scope: dict[str, Any] = {}
            if helpers is not None:
                scope.update((n, v) for n, v in helpers.items() if n not in saved_builtins)
            scope[entry] = entry_point
            scope["__builtins__"] = dict_(saved_builtins)
            scope["__name__"] = "__tests__"
            offset = "\n" * (payload["program_lines"] + 2)  # line numbers of the whole program
            exec_(compile_(offset + tests, "<candidate>", "exec"), scope)
            scope["check"](entry_point)
        except base_exception as e:
            try:
                report(e)
            finally:
                exit_now(1)
        try:
            flush()
        finally:
            write(status_fd, nonce)
            exit_now(0)

    def run():
        try:
            with open(payload_fd, "rb") as f:
                payload = loads(f.read())
            if judging:
                judge(payload)
            elif role == "candidate":
                candidate(payload)
            else:
                program(payload)
        finally:  # every role ends the process itself; this only on an unforeseen error
            flush()
            exit_now(1)

    done = _thread.allocate_lock()
    done.acquire()
    os.write(status_fd, b"S")  # the sandbox stood up: whatever fails from here on is the program's
    _thread.start_new_thread(run, ())
    del run
    try:
        done.acquire()  # never released: the role's thread ends the process
    finally:
        exit_now(1)


if __name__ == "__main__":
    _bootstrap()
