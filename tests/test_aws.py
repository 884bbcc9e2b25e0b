"""intentlog.integrations.aws against moto in server mode (a real HTTP server on 127.0.0.1),
real journals, and worker processes killed with SIGKILL. What was applied is read from the
service's own record: the bucket's objects and versions, the queue's messages.

Where moto or boto3 is missing the tests skip, except with CI=true, where they must run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import profiles
from intentlog._decide import decide

SUPPORT = Path(__file__).parent / "support"


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed (CI=true: AWS tests must run)", pytrace=False)
        pytest.skip(f"{module} is not installed (pip install 'intentlog[dev]')")


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    _need("boto3")
    _need("moto.server")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto loads a service's backend on its first request, which takes seconds on a loaded
    # machine: load them here, so the tests' short client timeouts meet warm services.
    setup_client(url, "s3").list_buckets()
    setup_client(url, "sqs").list_queues()
    setup_client(url, "sesv2").list_email_identities()
    try:
        yield url
    finally:
        server.stop()


def client(url: str, kind: str, **config: Any) -> Any:
    import boto3
    from botocore.config import Config

    settings = {"connect_timeout": 1, "read_timeout": 2, "retries": {"total_max_attempts": 1}}
    return boto3.client(
        kind,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(**{**settings, **config}),
    )


def setup_client(url: str, kind: str) -> Any:
    """A client for setting up and reading back, not under test: it waits as long as a
    loaded machine needs."""
    return client(url, kind, connect_timeout=60, read_timeout=60)


@pytest.fixture
def bucket(moto_url: str) -> str:
    name = f"intentlog-{uuid.uuid4().hex[:12]}"
    s3 = setup_client(moto_url, "s3")
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture
def queue(moto_url: str) -> str:
    sqs = setup_client(moto_url, "sqs")
    url = sqs.create_queue(
        QueueName=f"intentlog-{uuid.uuid4().hex[:12]}.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    return str(url)


def versions(url: str, bucket: str) -> list[tuple[str, str]]:
    """(object key, version id) of every version the bucket holds: each write is one."""
    listing = setup_client(url, "s3").list_object_versions(Bucket=bucket)
    return [(v["Key"], v["VersionId"]) for v in listing.get("Versions", [])]


def received(url: str, queue: str) -> list[dict[str, Any]]:
    """Every message the queue delivers now (none is deleted, so none comes back later)."""
    sqs = setup_client(url, "sqs")
    out: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(
            QueueUrl=queue,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=600,
            AttributeNames=["MessageDeduplicationId"],
        ).get("Messages", [])
        if not batch:
            return out
        out += batch


def worker(
    kind: str, journal: Path, config: dict[str, Any], crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    script = str(SUPPORT / "service_workers.py")
    return subprocess.run(
        [sys.executable, script, kind, str(journal), json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def outcome(run: subprocess.CompletedProcess[str]) -> Any:
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def only_op(journal: Path) -> intentlog.Operation:
    with intentlog.open(journal) as j:
        (op,) = j.operations()
        return op


# -- S3 conditional writes -------------------------------------------------------------------


def test_s3_put_receipt_replay_and_lookup(tmp_path: Path, moto_url: str, bucket: str) -> None:
    from intentlog.integrations.aws import s3_put_effect

    s3 = client(moto_url, "s3")
    effect = s3_put_effect(s3, bucket, name="store", object_key="r/{key}.json")
    assert effect.service is profiles.S3_CONDITIONAL
    assert effect.timeout == 3.0  # the client's: one attempt of 1 s connect + 2 s read
    assert effect.idempotent and effect.key_retention is intentlog.FOREVER
    assert effect.reconcile is not None
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        first = task.run(effect, total=5, order=7)
        (op,) = journal.operations()
    assert first["replayed"] is False and first["key"] == f"r/{op.key}.json"
    assert first["version_id"] and first["etag"]
    body = s3.get_object(Bucket=bucket, Key=first["key"])["Body"].read()
    assert body == b'{"order":7,"total":5}'  # canonical bytes, whatever the argument order
    # A second send of the same key (as after a lost answer) is refused with 412: a replay.
    again = effect.submit(op.key, order=7, total=5)
    assert again == {**first, "replayed": True}
    assert effect.reconcile(op.key) == intentlog.Found({**first, "replayed": True})
    assert effect.reconcile("never-written") == intentlog.NotFound()
    assert versions(moto_url, bucket) == [(first["key"], first["version_id"])]


def test_s3_foreign_object_is_a_key_conflict(tmp_path: Path, moto_url: str, bucket: str) -> None:
    from intentlog.integrations.aws import s3_put_effect

    s3 = client(moto_url, "s3")
    effect = s3_put_effect(s3, bucket, name="store", object_key="{key}")
    s3.put_object(Bucket=bucket, Key="order-9", Body=b"someone else's")
    with (
        intentlog.open(tmp_path / "j.db") as journal,
        journal.task("t") as task,
        pytest.raises(intentlog.KeyConflict, match="another writer"),
    ):
        task.run(effect, key="order-9", order=9)
    assert only_op(tmp_path / "j.db").state is intentlog.State.FAILED
    found = effect.reconcile("order-9")
    assert isinstance(found, intentlog.Indeterminate) and "another writer" in found.reason
    assert len(versions(moto_url, bucket)) == 1


def test_s3_deleted_object_is_not_denied(moto_url: str, bucket: str) -> None:
    from intentlog.integrations.aws import s3_put_effect

    s3 = client(moto_url, "s3")
    effect = s3_put_effect(s3, bucket, name="store")
    effect.submit("k-1", order=1)
    s3.delete_object(Bucket=bucket, Key="k-1")  # a delete marker on a versioned bucket
    found = effect.reconcile("k-1")
    assert isinstance(found, intentlog.Indeterminate) and "deleted since" in found.reason


def test_s3_refusals_and_doubts(tmp_path: Path, moto_url: str) -> None:
    from intentlog.integrations.aws import AmbiguousResponse, s3_put_effect

    missing = s3_put_effect(client(moto_url, "s3"), "no-such-bucket-here", name="store")
    with (
        intentlog.open(tmp_path / "j.db") as journal,
        journal.task("t") as task,
        pytest.raises(intentlog.Rejected, match="NoSuchBucket"),
    ):
        task.run(missing, order=1)
    assert only_op(tmp_path / "j.db").state is intentlog.State.FAILED
    # Nothing listens: the request may have reached something, so it is a doubt, not FAILED.
    down = s3_put_effect(client("http://127.0.0.1:9", "s3"), "b-1", name="store")
    with pytest.raises(AmbiguousResponse, match="may have been applied"):
        down.submit("k", order=1)
    result = down.reconcile("k")
    assert isinstance(result, intentlog.Indeterminate) and "HeadObject failed" in result.reason


def test_bad_settings_are_refused(moto_url: str) -> None:
    from intentlog.integrations.aws import s3_put_effect, sqs_fifo_effect

    s3, sqs = client(moto_url, "s3"), client(moto_url, "sqs")
    for kwargs, message in [
        ({"object_key": "fixed"}, "must hold '{key}' once"),
        ({"timeout": 1}, "shorter than the client may keep a request"),
    ]:
        with pytest.raises(intentlog.InvalidInput, match=message):
            s3_put_effect(s3, "b-1", name="store", **kwargs)
    with pytest.raises(intentlog.InvalidInput, match=r"need a boto3 s3 client .* for sqs"):
        s3_put_effect(sqs, "b-1", name="store")
    with pytest.raises(intentlog.InvalidInput, match="need a boto3 sqs client"):
        sqs_fifo_effect(object(), moto_url + "/1/q.fifo", name="q", group_id="g")
    with pytest.raises(intentlog.InvalidInput, match="not a FIFO queue"):
        sqs_fifo_effect(sqs, moto_url + "/123456789012/plain", name="q", group_id="g")
    with pytest.raises(intentlog.InvalidInput, match="group_id"):
        sqs_fifo_effect(sqs, moto_url + "/1/q.fifo", name="q", group_id="")
    # botocore's defaults (60 s timeouts, several attempts) leave no room inside 5 minutes.
    slow = client(moto_url, "sqs", connect_timeout=60, read_timeout=60, retries={})
    with pytest.raises(intentlog.InvalidInput, match="no time inside SQS"):
        sqs_fifo_effect(slow, moto_url + "/1/q.fifo", name="q", group_id="g")


@pytest.mark.parametrize("point", ["after_send", "after_remote_commit"])
def test_s3_killed_in_flight_confirms_one_object(
    tmp_path: Path, moto_url: str, bucket: str, point: str
) -> None:
    config = {"endpoint": moto_url, "bucket": bucket}
    journal = tmp_path / "j.db"
    assert worker("s3", journal, config, crash=f"{point}:store").returncode == -signal.SIGKILL
    (written,) = versions(moto_url, bucket)  # the first put landed before the kill
    assert only_op(journal).state is intentlog.State.SUBMITTED
    done = outcome(worker("s3", journal, config))
    # HeadObject found it: confirmed with the first write's version, nothing written again.
    assert done["receipt"]["version_id"] == written[1] and done["receipt"]["replayed"] is True
    assert versions(moto_url, bucket) == [written]
    op = only_op(journal)
    assert op.state is intentlog.State.CONFIRMED and op.attempts == 1
    assert op.receipt == done["receipt"] and op.policy.service == "s3-conditional-put"


def test_s3_killed_before_sending_writes_once(tmp_path: Path, moto_url: str, bucket: str) -> None:
    config = {"endpoint": moto_url, "bucket": bucket}
    journal = tmp_path / "j.db"
    assert worker("s3", journal, config, crash="after_submit_mark:store").returncode == -9
    assert versions(moto_url, bucket) == []
    done = outcome(worker("s3", journal, config))  # NotFound, once trusted: written now
    assert done["receipt"]["replayed"] is False
    assert versions(moto_url, bucket) == [(done["receipt"]["key"], done["receipt"]["version_id"])]


# -- SQS FIFO --------------------------------------------------------------------------------


def test_sqs_send_receipt_and_dedup(tmp_path: Path, moto_url: str, queue: str) -> None:
    from intentlog.integrations.aws import sqs_fifo_effect

    effect = sqs_fifo_effect(
        client(moto_url, "sqs"),
        queue,
        name="enqueue",
        group_id=lambda body: f"order-{body['order']}",
    )
    assert effect.service is profiles.SQS_FIFO and effect.key_retention == 300.0
    assert effect.reconcile is None and effect.timeout == 3.0
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        receipt = task.run(effect, order=7, total=5)
        assert task.run(effect, total=5, order=7) == receipt  # the same call: the receipt
        (op,) = journal.operations()
    assert set(receipt) == {"message_id", "sequence_number"}
    effect.submit(op.key, order=7, total=5)  # a resend of the same key: dropped by SQS
    (message,) = received(moto_url, queue)
    assert message["Body"] == '{"order":7,"total":5}'
    assert message["Attributes"]["MessageDeduplicationId"] == op.key


def test_sqs_refusals(tmp_path: Path, moto_url: str) -> None:
    from intentlog.integrations.aws import sqs_fifo_effect

    effect = sqs_fifo_effect(
        client(moto_url, "sqs"), moto_url + "/123456789012/gone.fifo", name="enqueue", group_id="g"
    )
    with (
        intentlog.open(tmp_path / "j.db") as journal,
        journal.task("t") as task,
        pytest.raises(intentlog.Rejected, match=r"NonExistentQueue|does not exist"),
    ):
        task.run(effect, order=1)
    with pytest.raises(intentlog.Rejected, match="not a valid SQS id"):
        effect.submit("k" * 129, order=1)  # refused before anything is sent


@pytest.mark.parametrize("point", ["after_send", "after_remote_commit"])
def test_sqs_killed_in_flight_resends_same_id(
    tmp_path: Path, moto_url: str, queue: str, point: str
) -> None:
    config = {"endpoint": moto_url, "queue": queue}
    journal = tmp_path / "j.db"
    killed = worker("sqs", journal, config, crash=f"{point}:enqueue")
    assert killed.returncode == -signal.SIGKILL
    first = only_op(journal)
    assert first.state is intentlog.State.SUBMITTED
    # Waits out the dead worker's request deadline, then resends the same id: SQS drops it.
    done = outcome(worker("sqs", journal, config))
    op = only_op(journal)
    assert op.state is intentlog.State.CONFIRMED and op.attempts == 2
    assert op.receipt == done["receipt"]
    (message,) = received(moto_url, queue)
    assert message["Attributes"]["MessageDeduplicationId"] == op.key
    # Past SQS's 5 minutes (less the margin) the same crash could not be resent: UNRESOLVED.
    assert first.first_submitted_at is not None
    late = decide(first, first.policy, first.first_submitted_at + 300, submitter_gone=True)
    assert late.action is intentlog.Action.ESCALATE and late.mark is intentlog.State.UNRESOLVED
    early = decide(first, first.policy, first.first_submitted_at + 10, submitter_gone=True)
    assert early.action is intentlog.Action.SUBMIT


# -- SES -------------------------------------------------------------------------------------


@pytest.fixture
def sender(moto_url: str) -> str:
    """A verified sender of its own (moto keeps one SES account for the whole module)."""
    address = f"shop-{uuid.uuid4().hex[:8]}@example.com"
    setup_client(moto_url, "sesv2").create_email_identity(EmailIdentity=address)
    return address


def sent_mail(url: str, sender: str) -> list[dict[str, Any]]:
    """Every message SES accepted from ``sender``: moto's own record, read over HTTP."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=10) as answer:
        data = json.load(answer)
    return [m for m in data["ses"]["Message"] if m["source"] == sender]


def test_ses_send_receipt_and_the_key_where_a_person_finds_it(
    tmp_path: Path, moto_url: str, sender: str
) -> None:
    from intentlog.integrations.aws import ses_send_effect

    ses = client(moto_url, "sesv2")
    calls: list[dict[str, Any]] = []
    ses.meta.events.register("provide-client-params.sesv2.SendEmail",
                             lambda params, **_: calls.append(params))  # fmt: skip
    effect = ses_send_effect(ses, name="mail", sender=sender)
    assert effect.service is profiles.SES and not effect.policy.idempotent
    assert effect.reconcile is None and effect.timeout == 3.0
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        receipt = task.run(effect, to="ada@example.com", subject="Order 7", text="Thanks")
        assert task.run(effect, to="ada@example.com", subject="Order 7", text="Thanks") == receipt
        (op,) = journal.operations()
    (mail,) = sent_mail(moto_url, sender)
    assert receipt == {"message_id": mail["id"]} and mail["destinations"] == {
        "ToAddresses": ["ada@example.com"]
    }
    (params,) = calls  # the same call again was answered from the journal
    assert params["Content"]["Simple"]["Headers"] == [{"Name": "Intentlog-Key", "Value": op.key}]
    assert params["EmailTags"] == [{"Name": "intentlog-key", "Value": op.key}]


def test_ses_refusals_are_failed_and_send_nothing(
    tmp_path: Path, moto_url: str, sender: str
) -> None:
    from intentlog.integrations.aws import ses_send_effect

    ses = client(moto_url, "sesv2")
    unverified = ses_send_effect(ses, name="mail", sender="nobody@example.com")
    effect = ses_send_effect(ses, name="mail2", sender=sender)
    with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
        with pytest.raises(intentlog.Rejected, match="not verified"):
            task.run(unverified, to="ada@example.com", subject="s", text="t")
        with pytest.raises(intentlog.Rejected, match="text or html"):
            task.run(effect, to="ada@example.com", subject="s")
        with pytest.raises(intentlog.Rejected, match="no recipient"):
            task.run(effect, subject="s", text="t")
        with pytest.raises(intentlog.Rejected, match="unknown argument"):
            task.run(effect, to="ada@example.com", subject="s", text="t", attachments=["x"])
        assert {op.state for op in journal.operations()} == {intentlog.State.FAILED}
    assert sent_mail(moto_url, sender) == []
    with pytest.raises(intentlog.InvalidInput, match="sender must be an email address"):
        ses_send_effect(ses, name="m", sender="shop")
    with pytest.raises(intentlog.InvalidInput, match="need a boto3 sesv2 client"):
        ses_send_effect(client(moto_url, "ses"), name="m", sender=sender)


@pytest.mark.parametrize(("point", "mails"), [("after_submit_mark", 0), ("after_send", 1)])
def test_ses_killed_once_the_send_may_have_started_is_unresolved_never_sent_twice(
    tmp_path: Path, moto_url: str, sender: str, point: str, mails: int
) -> None:
    config = {"endpoint": moto_url, "sender": sender, "args": {"to": "ada@example.com",
              "subject": "Order 7", "text": "Thanks"}}  # fmt: skip
    journal = tmp_path / "j.db"
    assert worker("ses", journal, config, crash=f"{point}:mail").returncode == -signal.SIGKILL
    assert len(sent_mail(moto_url, sender)) == mails
    restarted = worker("ses", journal, config)
    assert restarted.returncode == 3, restarted.stdout + restarted.stderr
    with intentlog.open(journal) as j:
        (pending,) = j.pending()
        assert pending.state is intentlog.State.UNRESOLVED
        assert pending.next_action is intentlog.Action.ESCALATE
        # A person checks SES's sending events for the key and says what happened.
        if mails:
            (mail,) = sent_mail(moto_url, sender)
            j.resolve(pending.key, "confirmed", receipt={"message_id": mail["id"]},
                      note="found in the SES events", accept_risk=True)  # fmt: skip
        else:
            j.resolve(pending.key, "retry", note="no SES event for the key", accept_risk=True)
    assert len(sent_mail(moto_url, sender)) == mails  # the restart itself sent nothing
    done = outcome(worker("ses", journal, config))
    (mail,) = sent_mail(moto_url, sender)  # confirmed: no send; retry: sent now, once
    assert done["receipt"] == {"message_id": mail["id"]}


def test_ses_killed_before_the_intent_was_submitted_sends_once(
    tmp_path: Path, moto_url: str, sender: str
) -> None:
    config = {"endpoint": moto_url, "sender": sender, "args": {"to": "ada@example.com",
              "subject": "Order 7", "text": "Thanks"}}  # fmt: skip
    journal = tmp_path / "j.db"
    assert worker("ses", journal, config, crash="after_plan:mail").returncode == -signal.SIGKILL
    done = outcome(worker("ses", journal, config))  # PLANNED: nothing was sent, so sent now
    (mail,) = sent_mail(moto_url, sender)
    assert done["receipt"] == {"message_id": mail["id"]}


def test_missing_boto3_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "from intentlog.integrations.aws import s3_put_effect\n"
        "s3_put_effect(None, 'b', name='x')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and "pip install 'intentlog[aws]'" in run.stderr


def test_docs_aws_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_url: str
) -> None:
    from integration_workflows import run_doc_section

    monkeypatch.chdir(tmp_path)
    assert run_doc_section("AWS: S3 conditional writes, SQS FIFO and SES") == 2
