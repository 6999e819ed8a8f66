"""Hostile completions for code-execution grading (importable as tests.hostile_code): function
bodies for any HumanEval-style task, each of which must grade as a plain failure.

* forgeries look for the run's pass marker (a 32-hex nonce) wherever the candidate's code
  might reach it (module globals, frames by every route, gc, raw memory) and replay it on
  every file descriptor and on stdout, then exit 0: they pass only if they found it;
* cheats try to pass without the right answer (objects equal to anything, the tests read
  back from linecache, early exits, printed markers);
* escapes and bombs first try something the sandbox must refuse (a root-only host file, a
  host UNIX socket, memfd/shm/tmpfs/thread bombs) and then run the honest body: they pass
  only if the sandbox let the attempt through.
"""

from __future__ import annotations

_SCAN = (
    "    import os, re\n    found = set()\n"
    "    def scan(namespace):\n"
    "        for v in list(namespace.values()):\n"
    "            b = v.encode() if isinstance(v, str) else v\n"
    "            if isinstance(b, bytes) and re.fullmatch(rb'[0-9a-f]{32}', b):\n"
    "                found.add(b)\n"
)
_WALK = "    while f:\n        scan(f.f_locals)\n        scan(f.f_globals)\n        f = f.f_back\n"
_REPLAY = (
    "    for n in found:\n        for fd in range(3, 20):\n"
    "            try:\n                os.write(fd, n)\n            except OSError:\n                pass\n"
    "        print('\\n' + n.decode(), flush=True)\n    os._exit(0)\n"
)

# Everything reachable from what the interpreter hands out without a refused call: gc.garbage
# (DEBUG_SAVEALL, filled from gc.callbacks and by weakref callbacks firing during a
# collection), tracebacks, every class's __subclasses__() and their dicts, sys.modules and
# the modules' globals; every frame met is walked (f_back, f_locals, f_globals) and every
# 32-hex string or bytes kept.
_GRAPH_WALK = (
    _SCAN
    + "    import gc, sys, weakref\n    frames, seen, todo = [], set(), []\n"
    + "    def keep(o):\n        if id(o) not in seen:\n            seen.add(id(o))\n            todo.append(o)\n"
    + "    def cycle():\n        try:\n            raise KeyError\n        except KeyError as e:\n            err = e\n"
    + "    class Box:\n        pass\n"
    + "    box = Box()\n    box.me = box\n    box.exc = None\n"
    + "    def fired(ref):\n        try:\n            raise OSError\n        except OSError as e:\n"
    + "            todo.append(e)\n            cycle()\n"
    + "    hold = weakref.ref(box, fired)\n    del box\n"
    + "    gc.callbacks.append(lambda phase, info: todo.extend(gc.garbage))\n"
    + "    gc.set_debug(gc.DEBUG_SAVEALL)\n    cycle()\n    gc.collect()\n    gc.collect()\n    gc.set_debug(0)\n"
    + "    gc.callbacks.clear()\n    todo.extend(gc.garbage)\n    todo.extend(sys.modules.values())\n"
    + "    todo.extend(object.__subclasses__())\n    todo.append(sys.exc_info())\n"
    + "    budget = 200000\n"
    + "    while todo and budget > 0:\n        budget -= 1\n        o = todo.pop()\n"
    + "        kind = type(o).__name__\n"
    + "        try:\n"
    + "            if kind == 'frame':\n                frames.append(o)\n"
    + "                scan(o.f_locals)\n                scan(o.f_globals)\n"
    + "                for x in (o.f_back, *o.f_locals.values()):\n                    keep(x)\n"
    + "            elif isinstance(o, (str, bytes)):\n                scan({0: o})\n"
    + "            elif isinstance(o, dict):\n                scan(o)\n"
    + "                for x in list(o.values()):\n                    keep(x)\n"
    + "            elif isinstance(o, (list, tuple, set, frozenset)):\n"
    + "                for x in list(o):\n                    keep(x)\n"
    + "            elif isinstance(o, type):\n                keep(dict(vars(o)))\n"
    + "                for x in type.__subclasses__(o):\n                    keep(x)\n"
    + "            elif isinstance(o, BaseException):\n"
    + "                keep(o.__traceback__)\n                keep(o.__context__)\n                keep(o.args)\n"
    + "            elif kind == 'traceback':\n                keep(o.tb_next)\n"
    + "            elif hasattr(o, '__dict__'):\n                keep(dict(vars(o)))\n"
    + "        except Exception:\n            pass\n"
    + "    print('frames', len(frames), 'found', len(found), flush=True)\n"
)

FORGERIES = {
    "marker-in-main-globals": _SCAN + "    import __main__\n    scan(vars(__main__))\n" + _REPLAY,
    "marker-by-getframe": _SCAN + "    import sys\n    f = sys._getframe()\n" + _WALK + _REPLAY,
    "marker-by-traceback": _SCAN
    + "    try:\n        raise ValueError\n    except ValueError as e:\n        f = e.__traceback__.tb_frame\n"
    + _WALK
    + _REPLAY,
    "marker-by-generator-frame": _SCAN
    + "    def g():\n        yield 1\n    f = g().gi_frame.f_back\n"
    + _WALK
    + _REPLAY,
    "marker-by-current-frames": _SCAN
    + "    import sys\n    for f in list(sys._current_frames().values()):\n"
    + "        while f:\n            scan(f.f_locals)\n            f = f.f_back\n"
    + _REPLAY,
    "marker-by-inspect": _SCAN
    + "    import inspect\n    for info in inspect.stack():\n        scan(info.frame.f_locals)\n"
    + _REPLAY,
    "marker-by-gc": _SCAN
    + "    import gc\n    for o in gc.get_objects():\n        if isinstance(o, dict):\n            scan(o)\n"
    + _REPLAY,
    "marker-by-settrace": _SCAN
    + "    import sys\n    frames = []\n    sys.settrace(lambda f, e, a: frames.append(f))\n"
    + "    def probe():\n        pass\n    probe()\n    sys.settrace(None)\n    for f in frames:\n"
    + "        while f:\n            scan(f.f_locals)\n            f = f.f_back\n"
    + _REPLAY,
    "marker-by-signal-frame": _SCAN
    + "    import signal, time\n    frames = []\n    signal.signal(signal.SIGALRM, lambda s, f: frames.append(f))\n"
    + "    signal.setitimer(signal.ITIMER_REAL, 0.01)\n    time.sleep(0.1)\n"
    + "    for f in frames:\n        while f:\n            scan(f.f_locals)\n            f = f.f_back\n"
    + _REPLAY,
    "marker-by-proc-self-mem": "    import os, re\n    found = set()\n"
    "    mem = open('/proc/self/mem', 'rb', 0)\n    for line in open('/proc/self/maps'):\n"
    "        span, perms = line.split()[:2]\n        lo, hi = (int(x, 16) for x in span.split('-'))\n"
    "        if 'rw' not in perms or hi - lo > 1 << 26:\n            continue\n"
    "        try:\n            mem.seek(lo)\n            data = mem.read(hi - lo)\n        except OSError:\n            continue\n"
    "        found.update(re.findall(rb'([0-9a-f]{32})\\n(?:from|import|def) ', data))\n"
    '        found.update(re.findall(rb\'"nonce": "([0-9a-f]{32})"\', data))\n' + _REPLAY,
    "marker-by-ctypes": "    import ctypes\n    return ctypes.string_at(id(0), 64)\n",
    "marker-by-str-subclass-import": "    import _imp, importlib.util\n    class Name(str):\n"
    "        def startswith(self, *args):\n            return False\n"
    "        def __eq__(self, other):\n            return False\n"
    "        def __hash__(self):\n            return 0\n"
    "    spec = importlib.util.find_spec('_ctypes')\n    spec.name = Name('_ctypes')\n"
    "    return _imp.create_dynamic(spec).addressof\n",
    "marker-by-crafted-bytecode": "    f = lambda: 0\n    f.__code__ = f.__code__.replace(co_code=b'd\\xff' * 4)\n    return f()\n",
    # frames the collector hands back, no refused gc function called: with DEBUG_SAVEALL, a
    # collected cycle (an exception held by the frame it was raised in) lands in gc.garbage,
    # frame included, and a dead frame's f_back leads to the frames that called it
    "marker-by-gc-garbage-frames": _SCAN
    + "    import gc\n    def cycle():\n        try:\n            raise ValueError\n"
    + "        except ValueError as e:\n            err = e\n"
    + "    gc.set_debug(gc.DEBUG_SAVEALL)\n    cycle()\n    gc.collect()\n    gc.set_debug(0)\n"
    + "    for f in [o for o in gc.garbage if type(o).__name__ == 'frame']:\n"
    + _WALK.replace("    ", "        ", 1).replace("\n    ", "\n        ")
    + _REPLAY,
    "marker-by-object-graph-walk": _GRAPH_WALK + _REPLAY,
}

CHEATS = {
    "always-equal": "    class Eq:\n        def __eq__(self, other):\n            return True\n"
    "        def __bool__(self):\n            return True\n    return Eq()\n",
    "always-equal-int": "    class Eq(int):\n        def __eq__(self, other):\n            return True\n    return Eq(0)\n",
    "tests-read-from-linecache": "    args = tuple(locals().values())\n    import linecache, re\n"
    "    src = ''.join(linecache.getlines('<candidate>'))\n"
    "    table = dict(re.findall(r'candidate\\((.*?)\\) == (.+)', src))\n"
    "    return eval(table[repr(args)[1:-1].rstrip(',')])\n",
    "os-exit-zero": "    import os\n    os._exit(0)\n",
    "system-exit-zero": "    raise SystemExit(0)\n",
    "printed-marker": "    import os\n    print('\\n' + '0' * 32, flush=True)\n    os._exit(0)\n",
    "print-patched": "    import builtins, sys, io\n    builtins.print = lambda *a, **k: None\n"
    "    sys.stdout = io.StringIO()\n    raise ValueError('hidden')\n",
    "fake-bwrap-error": "    import os, sys\n    sys.stderr.write('bwrap: Can\\'t mount proc on /newroot/proc: Operation not permitted\\n')\n"
    "    sys.stderr.flush()\n    os._exit(1)\n",
}


def escapes(honest: str, secret_path: str, socket_path: str) -> dict[str, str]:
    """Attempts the sandbox must refuse, each followed by the honest body."""
    attempts = {
        "read-root-only-file": f"    open({secret_path!r}).read()\n",
        "connect-host-unix-socket": "    import socket\n    s = socket.socket(socket.AF_UNIX)\n"
        f"    s.connect({socket_path!r})\n",
        "memfd-bomb": "    import os\n    fds = [os.memfd_create('bomb') for _ in range(32)]\n"
        "    for fd in fds:\n        os.ftruncate(fd, 1 << 30)\n        os.posix_fallocate(fd, 0, 1 << 30)\n",
        "dev-shm-bomb": "    with open('/dev/shm/bomb', 'wb') as f:\n        f.write(b'x' * (1 << 28))\n",
        "tmpfs-bomb": "    for i in range(64):\n        with open(f'/tmp/bomb{i}', 'wb') as f:\n"
        "            f.write(b'x' * (8 << 20))\n",
        "thread-bomb": "    import threading, time\n    for _ in range(2000):\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
        "process-bomb": "    import os\n    os.fork()\n",
    }
    return {name: attempt + honest for name, attempt in attempts.items()}
