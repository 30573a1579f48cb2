"""The one SIGTERM policy: keep a handler, install over the default only, fire once, nest."""

from __future__ import annotations

import signal
import threading

import pytest

from verirl._signals import SigtermPolicy


def test_installed_over_the_default_raises_once_and_restores(default_sigterm):
    policy = SigtermPolicy()
    with policy.held() as counted:
        assert counted
        assert policy.active
        with pytest.raises(SystemExit) as info:
            signal.raise_signal(signal.SIGTERM)
        assert info.value.code == 128 + signal.SIGTERM
        assert policy.fired
        signal.raise_signal(signal.SIGTERM)  # again during the teardown: ignored
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_handler_of_the_program_is_kept_and_is_what_runs(default_sigterm):
    calls: list[int] = []

    def mine(signum, _frame):
        calls.append(signum)

    signal.signal(signal.SIGTERM, mine)
    policy = SigtermPolicy()
    with policy.held():
        assert not policy.active
        signal.raise_signal(signal.SIGTERM)  # no SystemExit: the program's handler ran
        assert calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is mine


def test_sig_ign_is_kept(default_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    policy = SigtermPolicy()
    with policy.held():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_nested_holders_restore_after_the_last_one(default_sigterm):
    policy = SigtermPolicy()
    with policy.held():
        with policy.held():
            assert policy.active
        assert policy.active  # the outer holder still needs it
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_each_outermost_hold_fires_afresh(default_sigterm):
    policy = SigtermPolicy()
    for _ in range(2):
        with policy.held(), pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)


def test_a_handler_installed_inside_the_block_is_left_in_place(default_sigterm):
    def mine(_signum, _frame):
        pass

    policy = SigtermPolicy()
    with policy.held():
        signal.signal(signal.SIGTERM, mine)
    assert signal.getsignal(signal.SIGTERM) is mine


def test_another_thread_neither_counts_nor_installs(default_sigterm):
    policy = SigtermPolicy()
    counted: list[bool] = []

    def hold():
        with policy.held() as was_counted:
            counted.append(was_counted)

    thread = threading.Thread(target=hold)
    thread.start()
    thread.join()
    assert counted == [False]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
