"""A function run in Triton's interpreter, from a machine with a GPU too: the checks and the grader use it for
what only the interpreter can show (every address a kernel makes, the tiles it visits)."""

import os
import sys

from gqa_flash.course import integrity, runtime


def in_interpreter(function: str, **kwargs):
    """``function(**kwargs)`` ("module:name", JSON arguments and result) in Triton's interpreter: called
    here when the kernels run there, else in a child Python with the GPU hidden. A child that stopped on
    an :class:`~gqa_flash.course.integrity.IntegrityViolation` raises it here too."""
    import importlib
    import json
    import subprocess

    module, name = function.split(":")
    if runtime.INTERPRETER:
        return getattr(importlib.import_module(module), name)(**kwargs)
    code = ("import importlib, json, sys; m, f = sys.argv[1].split(':'); "
            "print(json.dumps(getattr(importlib.import_module(m), f)(**json.loads(sys.argv[2]))))")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", code, function, json.dumps(kwargs)], capture_output=True,
                          text=True, env=env, timeout=300)
    if done.returncode != 0:
        for line in reversed(done.stderr.splitlines()):  # the child's verdict on whose work it was
            if "IntegrityViolation: " + integrity.PREFIX in line:
                raise integrity.IntegrityViolation(line.split("IntegrityViolation: ", 1)[1])
        raise RuntimeError(f"{function} failed in the interpreter:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])
