"""Runs first inside the code sandbox (sandbox.py), as `python -I -S -c <this file's text>
<payload fd> <status fd> <AS bytes> <FSIZE bytes> <CPU seconds> <open files> <threads>
<uid to drop to, 0: none> <early-exit code> <lib-dynload dir>`. The worker never imports it:
it reads this file as text. Standard library only.

The payload (JSON: nonce, program, tests, entry point, helpers) comes through an inherited memfd: not
argv (size limits), not stdin (left to the program). The status fd gets one byte once the
sandbox stood up (the uid dropped, rlimits set, the hook armed: anything failing before is
the worker's fault), and the nonce once the program and its tests ran to their end: that is
a pass. The nonce is kept where the candidate's code cannot reach it:

* the candidate runs in a thread of its own, which alone reads the payload, holds the nonce
  in its frame and ends the process; the main thread only waits. Signal handlers (which
  receive the main thread's frame) cannot be installed outside the main thread.
* an audit hook, armed before any candidate code runs, refuses every way to reach a frame
  or foreign objects (sys._getframe, sys._current_frames, tb_frame/gi_frame/cr_frame/
  ag_frame, gc.get_objects/get_referrers/get_referents, settrace/setprofile), raw memory
  (ctypes, the _test* modules, extension modules from outside lib-dynload), hand-made
  bytecode (code.__new__, marshal), exec and new audit hooks. /proc is not mounted.
* nothing lives in __main__'s globals but the function that runs (and it deletes itself);
  everything used after the candidate's code ran was captured before (builtins, modules and
  their attributes can all be rewritten by that code). Hence the unusual style below: no
  helper module, no builtin looked up late.

With tests (HumanEval): the task's helpers (its prompt) run first on their own; after the
candidate's code ran, builtins and sys.modules are put back, then the tests run in a
namespace of their own (the helpers' names, or else the program's, less those shadowing
builtins; the candidate's entry point; a private copy of the builtins) and `check(<entry point>)` is called
with the entry point wrapped so that it may only return plain values (bool, int, float,
str, None, and lists, tuples, dicts and sets of them): an object whose __eq__ always
answers True fails instead of passing.

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
    (payload_fd, status_fd, mem, fsize, cpu, nofile, nproc, uid, early_exit) = (
        int(a) for a in sys.argv[1:10]
    )
    dynload = os.path.normpath(sys.argv[10]) + os.sep
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
    # source (marshal is refused, so is every .pyc)
    for name in (
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
    ):
        __import__(name)
    write, exit_now, compile_, exec_, type_ = os.write, os._exit, compile, exec, type
    stdout, stderr, excepthook = sys.stdout, sys.stderr, sys.__excepthook__
    modules, builtins_dict = sys.modules, builtins.__dict__
    saved_builtins, saved_modules = dict(builtins_dict), dict(modules)
    loads, normpath, all_, repr_, type_error = json.loads, os.path.normpath, all, repr, TypeError
    frozen, bool_, int_, float_, str_, none = frozenset, bool, int, float, str, type(None)
    list_, tuple_, dict_, set_, complex_, bytes_ = list, tuple, dict, set, complex, bytes
    scalars = frozen((bool_, int_, float_, str_, none, complex_, bytes_))
    sequences = frozen((list_, tuple_, set_, frozen))

    denied_events = frozen(
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
            "marshal.loads",
            "marshal.load",
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
    denied_error, import_error, value_error = PermissionError, ImportError, ValueError

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

    sys.pycache_prefix = "/nonexistent"  # no .pyc is read (marshal is refused)
    sys.dont_write_bytecode = True
    sys.addaudithook(audit)

    def plain(value, depth=0):
        kind = type_(value)
        if kind in scalars:
            return True
        if depth > 32:
            return False
        if kind in sequences:
            return all_(plain(v, depth + 1) for v in value)
        if kind is dict_:
            return all_(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
        return False

    def guarded(function):
        def entry_point(*args, **kwargs):
            result = function(*args, **kwargs)
            if not plain(result):
                raise type_error(
                    "the entry point returned a "
                    + type_(result).__qualname__
                    + ", not a plain value (bool, int, float, str, None or a list, "
                    "tuple, dict or set of them)"
                )
            return result

        return entry_point

    def restore():
        for stream in (stdout, stderr):
            try:  # noqa: SIM105 (contextlib may have been rewritten by the program)
                stream.flush()
            except BaseException:
                pass
        builtins_dict.clear()
        builtins_dict.update(saved_builtins)
        for name in [m for m in modules if m not in saved_modules]:
            del modules[name]
        modules.update(saved_modules)  # a module the program replaced in sys.modules
        sys.stdout, sys.stderr = stdout, stderr

    def run():
        try:
            with open(payload_fd, "rb") as f:
                payload = loads(f.read())
            nonce = payload["nonce"].encode()
            program, tests, entry = payload["program"], payload["tests"], payload["entry_point"]
            helpers = None  # the task's own definitions, as the tests should see them
            if payload["helpers"] is not None:
                helpers = {"__name__": "__helpers__", "__builtins__": dict_(saved_builtins)}
                try:  # before any candidate code; a prompt that cannot run alone has none
                    exec_(compile_(payload["helpers"], "<prompt>", "exec"), helpers)
                except Exception:
                    helpers = None
            namespace = {"__name__": "__candidate__", "__builtins__": builtins}
            exec_(compile_(program, "<candidate>", "exec"), namespace)
            if tests is not None:
                restore()
                # The tests get a namespace of their own: the task's helpers (run apart
                # from the candidate's code, which cannot redefine them; else the
                # program's definitions) but no name shadowing a builtin, the candidate's
                # entry point, and builtins of their own, so that nothing the candidate's
                # code does while it is being tested reaches the names the tests look up.
                source = namespace if helpers is None else helpers
                scope: dict[str, Any] = {n: v for n, v in source.items() if n not in saved_builtins}
                scope[entry] = namespace[entry]
                scope["__builtins__"] = dict_(saved_builtins)
                scope["__name__"] = "__tests__"
                offset = "\n" * (program.count("\n") + 2)  # line numbers of the whole program
                exec_(compile_(offset + tests, "<candidate>", "exec"), scope)
                scope["check"](guarded(scope[entry]))
        except SystemExit as e:
            restore()
            stderr.write("program called exit(" + repr_(e.code)[:100] + ") before it finished\n")
            stderr.flush()
            exit_now(early_exit)
        except BaseException as e:
            try:
                restore()
                tb = e.__traceback__
                if tb is not None:
                    tb = e.__traceback__ = tb.tb_next  # not this frame (the printer reads the exception's)
                excepthook(type_(e), e, tb)
                stderr.flush()
            finally:
                exit_now(1)
        try:
            stdout.flush()
            stderr.flush()
        finally:
            write(status_fd, nonce)
            exit_now(0)

    done = _thread.allocate_lock()
    done.acquire()
    os.write(status_fd, b"S")  # the sandbox stood up: whatever fails from here on is the program's
    _thread.start_new_thread(run, ())
    del run
    try:
        done.acquire()  # never released: the candidate's thread ends the process
    finally:
        exit_now(1)


if __name__ == "__main__":
    _bootstrap()
