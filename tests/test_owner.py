"""Who holds a lease, and when its holder is known to be gone: same host and pid namespace,
and its process is not there. Anything else is unknown, so alive."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from intentlog._owner import _boot_id, _host, holder_is_dead, new_owner, same_process


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (reuse within the test is not a concern)


def test_a_holder_is_dead_only_in_this_host_and_namespace() -> None:
    mine = new_owner()
    assert not holder_is_dead(mine) and same_process(mine)
    assert mine.startswith(_host() + ":")
    gone = f"{_host()}:{_gone_pid()}:1:abcd"
    assert holder_is_dead(gone)
    # The same pid seen from another pid namespace, or from a host name alone (an owner
    # written before namespaces were part of it, or by a container sharing the host name):
    # a pid there means nothing here.
    host_only, _, namespace = _host().partition("/")
    elsewhere = f"{host_only}/1:{_gone_pid()}:1:abcd"
    assert not holder_is_dead(elsewhere)
    if namespace:
        assert not holder_is_dead(f"{host_only}:{_gone_pid()}:1:abcd")
    assert holder_is_dead(None) and holder_is_dead("")
    assert not holder_is_dead("another-host:1:1:abcd")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_live_holder_in_another_pid_namespace_is_not_taken_for_dead() -> None:
    """A worker in its own pid namespace (a container on this host with host networking)
    is pid 1 or 2 there; read here, that pid is another process, which made it look dead
    and let its live lease be taken over."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
               "import sys; from intentlog._owner import new_owner; print(new_owner(), "
               "flush=True); sys.stdin.read()"]  # fmt: skip
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        owner = child.stdout.readline().strip()
        try:
            if not owner:
                pytest.skip("unshare --pid is not permitted here")
            pid = int(owner.rsplit(":", 3)[1])
            assert pid < 10, owner  # its own numbering: pid 1 or 2 there, another process here
            assert not holder_is_dead(owner), owner  # alive, in its own namespace
        finally:
            child.stdin.close()
            child.wait(timeout=60)


def test_a_forked_child_names_itself_not_its_parent() -> None:
    # The process's own identity is made once per pid: a child forked after the parent made
    # its own must not reuse it (its leases would read as the parent's, alive or dead).
    parent = new_owner()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its owner and leave at once
        os.write(write, new_owner().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert parent.split(":")[-3] == str(os.getpid())
    assert child.split(":")[-3] == str(pid)
    assert not holder_is_dead(parent)
    assert holder_is_dead(child)  # the child has exited: its lease may be taken at once


def test_a_holder_on_another_machine_of_the_same_name_is_not_taken_for_dead() -> None:
    # Two machines may share a host name, and the initial pid namespace has the same number
    # on every Linux machine: only the boot id tells them apart (as it tells this boot from
    # the last). A pid read here says nothing of a process there.
    if not _boot_id():
        pytest.skip("no boot id on this system")
    same_name = _host().removesuffix(_boot_id())
    assert holder_is_dead(f"{same_name}{_boot_id()}:{_gone_pid()}:1:abcd")  # here: dead
    assert not holder_is_dead(f"{same_name}/000000000000:{_gone_pid()}:1:abcd")
