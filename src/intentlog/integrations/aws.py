"""AWS services as effects, with boto3: :func:`s3_put_effect`, :func:`sqs_fifo_effect` and
:func:`ses_send_effect`.

``pip install -e '.[aws]'`` from the clone (``'intentlog[aws]'`` once published). Each takes a
boto3 client the caller built (credentials, region and endpoint belong there; none of them
reaches the journal or an error message).

- :func:`s3_put_effect`: ``PutObject`` with ``If-None-Match: *`` to an object key that holds
  the operation key. S3 refuses a second create of that object with 412, so a resend after a
  lost answer can never write twice; the 412 is read as the replay it is, with the receipt
  from ``HeadObject``. ``HeadObject`` is also the lookup (S3 reads are strongly consistent).
  Contract: :data:`intentlog.profiles.S3_CONDITIONAL`.
- :func:`sqs_fifo_effect`: ``SendMessage`` to a FIFO queue with ``MessageDeduplicationId`` =
  the key. SQS drops a second message with that id for 5 minutes and cannot be asked about a
  message, so a crash in flight is resent with the same id inside the 5 minutes (less a
  margin) and becomes UNRESOLVED after. Contract: :data:`intentlog.profiles.SQS_FIFO`.
- :func:`ses_send_effect`: SES v2 ``SendEmail``. SES takes no idempotency key and cannot be
  asked whether a message went out, so an email whose send may have started (the worker died
  with the operation SUBMITTED) is UNRESOLVED, for a person, and never sent twice by itself.
  The key rides in an ``Intentlog-Key`` header and a message tag, where a person or an event
  destination finds it. Contract: :data:`intentlog.profiles.SES`.

Answers: a definite refusal (nothing left the process, or the one request sent got a 4xx that
is not a throttle, a timeout or a conflict) raises :class:`intentlog.Rejected`; a lost
connection, a timeout, a 5xx, a throttle or a refusal after an earlier attempt of the same
call may have landed raises :class:`AmbiguousResponse`, which the decision settles.

Of the effect options (:class:`intentlog.EffectOptions`) each takes ``timeout`` only; the others
are their profile's, and InvalidInput refuses them. The request deadline is the client's own:
botocore retries inside one call, so a request may be in flight for
``attempts * (connect_timeout + read_timeout)`` plus the back-off between attempts. The effect
reads that from ``client.meta.config`` and takes it as its timeout; build the client with tight
timeouts (``botocore.config.Config(connect_timeout=5, read_timeout=10,
retries={"total_max_attempts": 2})``), above all for SQS, whose 5 minutes must leave room to
wait out a request and resend it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
from collections.abc import Callable
from typing import Any, Unpack, cast

from intentlog import profiles
from intentlog._crash import crashpoint
from intentlog._decide import retention_margin, send_slack
from intentlog._effect import Effect, ReceiptSelector
from intentlog._effect_options import FIXED, EffectOptions, effect_contract
from intentlog._errors import InvalidInput, KeyConflict, Rejected
from intentlog._hygiene import scrub_text
from intentlog._keys import canonical_json
from intentlog._model import Found, Indeterminate, LookupResult, NotFound, Policy
from intentlog._service import Seconds, Service
from intentlog._validate import seconds
from intentlog.integrations import AmbiguousResponse, _call_body, _require

__all__ = ["AmbiguousResponse", "s3_put_effect", "ses_send_effect", "sqs_fifo_effect"]

METADATA_KEY = "intentlog-key"  # x-amz-meta-intentlog-key: which operation wrote the object
# Attempts per call when the client's configuration sets no number: botocore's defaults.
_DEFAULT_ATTEMPTS = {"legacy": 5, "standard": 3, "adaptive": 3}
_BACKOFF_CAP = 20.0  # botocore's largest pause between two attempts (standard mode)
# 4xx answers that do not prove "not applied" for the call as a whole: a timeout or a throttle
# is worth resending with the same key, and S3's 409 is a concurrent request on the object.
_NOT_REFUSALS = frozenset({408, 409, 429})
_THROTTLES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "RequestThrottled",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "SlowDown",
    "PriorRequestNotComplete", "RequestTimeout", "RequestTimeoutException",
})  # fmt: skip
# SQS: 1-128 characters, alphanumerics and punctuation (MessageDeduplicationId, MessageGroupId).
_SQS_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
# SES message tag values: up to 256 ASCII letters, digits, _ - . @ (SES v2 MessageTag,
# https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_MessageTag.html, read 2026-12-04).
_SES_TAG = re.compile(r"^[A-Za-z0-9_\-.@]{1,256}$")


def _boto() -> Any:
    return _require("boto3", "aws")


@dataclasses.dataclass
class _Call:
    """One API call of an effect: how many requests left the process, for its crash point."""

    effect: str
    sends: int = 0


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "intentlog_aws_call", default=None
)


def _on_send(**_: Any) -> None:
    # botocore's before-send: the signed request is about to go out (every attempt).
    call = _CURRENT.get()
    if call is not None:
        call.sends += 1


def _on_answer(**_: Any) -> None:
    # botocore's before-parse: an answer arrived and nothing of it is read yet. botocore has
    # no point between writing a request and reading its answer; this is the closest after.
    call = _CURRENT.get()
    if call is not None:
        crashpoint("after_send", call.effect)


def _hook(client: Any, service: str, operation: str) -> None:
    """Count and mark our calls of ``operation`` on ``client``; once per client (the unique
    ids make a second registration a no-op), and a no-op for the client's other callers."""
    events = client.meta.events
    events.register(
        f"before-send.{service}.{operation}",
        _on_send,
        unique_id=f"intentlog-send-{service}-{operation}",
    )
    events.register(
        f"before-parse.{service}.{operation}",
        _on_answer,
        unique_id=f"intentlog-answer-{service}-{operation}",
    )


def _call(client: Any, operation: str, effect: str, **params: Any) -> tuple[Any, _Call]:
    """``client.<operation>(**params)`` counting its requests; the error is mapped by the
    caller, which knows what a refusal means there."""
    call = _Call(effect)
    token = _CURRENT.set(call)
    try:
        return getattr(client, operation)(**params), call
    except Exception as exc:
        raise _Failed(exc, call) from exc
    finally:
        _CURRENT.reset(token)


class _Failed(Exception):
    def __init__(self, error: Exception, call: _Call) -> None:
        super().__init__(str(error))
        self.error, self.call = error, call


def _status(exc: Exception) -> tuple[int | None, str]:
    """HTTP status and error code of a botocore ClientError (None, "" for other errors)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, ""
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code", "")
    return (status if isinstance(status, int) else None), str(code)


def _outcome(failed: _Failed, what: str, key: str) -> Exception:
    """Rejected when the call certainly applied nothing, else AmbiguousResponse."""
    exc, sends = failed.error, failed.call.sends
    status, code = _status(exc)
    detail = scrub_text(f"{type(exc).__name__}: {exc}", limit=300)
    if sends == 0:
        # Refused before any request left the process (parameters, credentials, region).
        return Rejected(f"{what}: not sent ({detail})", key=key)
    refused = (
        status is not None
        and 400 <= status < 500
        and status not in _NOT_REFUSALS
        and code not in _THROTTLES
    )
    if refused and sends == 1:
        return Rejected(f"{what} refused ({status} {code}): {detail}", key=key, status=status)
    doubt = "" if sends == 1 else f" after {sends} attempts, an earlier one may have landed"
    return AmbiguousResponse(
        f"{what} failed{doubt} ({detail}); it may have been applied", key=key, status=status
    )


def client_deadline(client: Any) -> float:
    """The longest one call on ``client`` may keep a request in flight: every attempt its
    retry configuration allows, each its connect and read timeout, and the back-off between
    them. InvalidInput if the client has no timeout (a request could then land at any time)."""
    config = client.meta.config
    connect, read = config.connect_timeout, config.read_timeout
    if not all(isinstance(t, int | float) and t > 0 for t in (connect, read)):
        raise InvalidInput(
            "the boto3 client needs a connect_timeout and a read_timeout "
            "(botocore.config.Config(connect_timeout=5, read_timeout=10)): without them a "
            "request could land at any time"
        )
    retries = config.retries or {}
    if "total_max_attempts" in retries:
        attempts = int(retries["total_max_attempts"])
    elif "max_attempts" in retries:
        attempts = int(retries["max_attempts"]) + 1  # botocore counts retries there
    else:
        attempts = _DEFAULT_ATTEMPTS.get(str(retries.get("mode")), 5)
    attempts = max(attempts, 1)
    return float(attempts * (connect + read) + (attempts - 1) * _BACKOFF_CAP)


def _timeout(client: Any, service: str, timeout: Seconds | None, name: str) -> float:
    """The effect's request deadline; InvalidInput unless ``client`` is a boto3 client of
    ``service`` whose deadline ``timeout`` (if given) covers."""
    try:
        actual = client.meta.service_model.service_name
    except AttributeError:
        actual = None
    if actual != service:
        raise InvalidInput(
            f"effect {name!r}: need a boto3 {service} client (boto3.client({service!r})), got "
            f"{type(client).__name__}{f' for {actual}' if actual else ''}"
        )
    deadline = client_deadline(client)
    if timeout is None:
        return deadline
    given = seconds(f"effect {name!r}: timeout", timeout, positive=True, bounded=False)
    if given < deadline:
        raise InvalidInput(
            f"effect {name!r}: timeout {given:g}s is shorter than the client may keep a request "
            f"in flight ({deadline:g}s: its attempts, timeouts and back-off); lower the client's "
            "timeouts or retries instead"
        )
    return given


def _body(fields: dict[str, Any]) -> str:
    # Canonical bytes: the same call sends the same bytes on every attempt, whatever the
    # order its arguments were passed in.
    return canonical_json(_call_body(fields), what="the message body")


# -- S3 ------------------------------------------------------------------------------------


def s3_put_effect(
    client: Any,
    bucket: str,
    *,
    name: str,
    object_key: str = "{key}",
    content_type: str = "application/json",
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect:
    """An Effect that writes the call's keyword arguments as JSON (``task.run(effect,
    json=value)`` writes ``value`` itself) to ``bucket`` at ``object_key``, whose ``{key}`` is
    replaced by the operation key, with ``If-None-Match: *``.

    The receipt is ``{"bucket", "key", "etag", "version_id", "replayed"}`` (``version_id`` is
    None on an unversioned bucket; ``replayed`` is True when an earlier attempt had written
    the object). The object carries the operation key in its metadata (``intentlog-key``), so
    a replay or a lookup confirms only an object this operation wrote; an object there that
    another writer put raises :class:`intentlog.KeyConflict`.

    Outcomes: written -> the receipt; 412 -> the replay's receipt from ``HeadObject``; a
    definite refusal (no such bucket, access denied) -> :class:`intentlog.Rejected`;
    otherwise :class:`AmbiguousResponse`. The lookup (``HeadObject``): the object -> Found;
    404 -> NotFound, except where the key's current version is a delete marker (it was
    written and deleted since: Indeterminate); anything else -> Indeterminate. An object
    deleted on an unversioned bucket is not seen as written: do not delete objects whose
    operations may still be pending.
    """
    _boto()
    if not isinstance(bucket, str) or not bucket:
        raise InvalidInput(f"effect {name!r}: bucket must be a bucket name, got {bucket!r}")
    if not isinstance(object_key, str) or object_key.count("{key}") != 1:
        raise InvalidInput(
            f"effect {name!r}: object_key must hold '{{key}}' once (the operation key names "
            f"the object), got {object_key!r}"
        )
    if not isinstance(content_type, str) or not content_type:
        raise InvalidInput(f"effect {name!r}: content_type must be a MIME type")
    # The contract is S3's own: only timeout may be given (refused here, before the client
    # is asked anything).
    effect_contract(f"effect {name!r}", options, profiles.S3_CONDITIONAL,
                    caller="s3_put_effect", spelling=FIXED)  # fmt: skip
    effective = _timeout(client, "s3", options.get("timeout"), name)
    _hook(client, "s3", "PutObject")
    target = _Bucket(client, bucket, object_key, name)

    def submit(key: str, /, **fields: Any) -> dict[str, Any]:
        return target.put(key, _body(fields).encode("utf-8"), content_type)

    def reconcile(key: str) -> LookupResult:
        return target.find(key)

    return Effect(
        name,
        submit,
        reconcile=reconcile,
        service=profiles.S3_CONDITIONAL,
        timeout=effective,
        receipt=receipt,
        store_args=store_args,
    )


@dataclasses.dataclass(frozen=True)
class _Bucket:
    client: Any
    bucket: str
    template: str
    name: str

    def object_for(self, key: str) -> str:
        return self.template.replace("{key}", key)

    def put(self, key: str, body: bytes, content_type: str) -> dict[str, Any]:
        where = self.object_for(key)
        what = f"PutObject s3://{self.bucket}/{where}"
        try:
            answer, _ = _call(
                self.client,
                "put_object",
                self.name,
                Bucket=self.bucket,
                Key=where,
                Body=body,
                ContentType=content_type,
                IfNoneMatch="*",
                Metadata={METADATA_KEY: key},
            )
        except _Failed as failed:
            status, _code = _status(failed.error)
            if status != 412:
                raise _outcome(failed, what, key) from failed.error
            # The object exists: an earlier attempt of ours wrote it (checked by its
            # metadata), and this answer is its replay. The receipt comes from HeadObject.
            found, foreign = self.inspect(key)
            if isinstance(found, Found):
                return cast("dict[str, Any]", found.receipt)
            reason = found.reason if isinstance(found, Indeterminate) else "not found"
            if foreign:  # not ours: this operation wrote nothing there
                raise KeyConflict(f"{what}: {reason}", key=key, status=412) from None
            raise AmbiguousResponse(
                f"{what} answered 412 (the object exists) but HeadObject could not read it "
                f"({reason})",
                key=key,
                status=412,
            ) from None
        return self._receipt(where, answer, replayed=False)

    def find(self, key: str) -> LookupResult:
        return self.inspect(key)[0]

    def inspect(self, key: str) -> tuple[LookupResult, bool]:
        """The lookup's answer, and whether the object there was written by another writer."""
        where = self.object_for(key)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=where)
        except Exception as exc:
            status, _ = _status(exc)
            headers = (
                getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
            )
            if status == 404 and str(headers.get("x-amz-delete-marker", "")).lower() == "true":
                gone = f"s3://{self.bucket}/{where} was written and deleted since"
                return Indeterminate(gone), False
            if status == 404:
                return NotFound(), False
            failed = f"HeadObject failed: {type(exc).__name__}: {exc}"
            return Indeterminate(scrub_text(failed, limit=300)), False
        owner = (head.get("Metadata") or {}).get(METADATA_KEY)
        if owner != key:
            foreign = f"s3://{self.bucket}/{where} holds an object of another writer (its "
            return Indeterminate(f"{foreign}{METADATA_KEY} is {owner!r})"), True
        return Found(self._receipt(where, head, replayed=True)), False

    def _receipt(self, where: str, answer: Any, *, replayed: bool) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "key": where,
            "etag": answer.get("ETag"),
            "version_id": answer.get("VersionId"),
            "replayed": replayed,
        }


# -- SQS FIFO ------------------------------------------------------------------------------


def sqs_fifo_effect(
    client: Any,
    queue_url: str,
    *,
    name: str,
    group_id: str | Callable[[Any], str],
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect:
    """An Effect that sends the call's keyword arguments as JSON (``task.run(effect,
    json=value)`` sends ``value`` itself) to the FIFO queue ``queue_url``, with
    ``MessageDeduplicationId`` = the operation key and ``MessageGroupId`` = ``group_id`` (a
    string, or a function of the message body that returns one: the order messages keep).

    The receipt is ``{"message_id", "sequence_number"}``. SQS honours the id for 5 minutes
    and cannot be asked about a message: a crash in flight is resent with the same id once
    the request's deadline has passed, while the 5 minutes (minus a margin) last, and becomes
    UNRESOLVED after. Outcomes as for every effect of this module: a definite refusal (no
    such queue, a bad parameter) -> :class:`intentlog.Rejected`; otherwise
    :class:`AmbiguousResponse`. A key or group id that SQS cannot take (1-128 alphanumeric
    or punctuation characters) is refused before anything is sent.
    """
    _boto()
    if not isinstance(queue_url, str) or not queue_url.endswith(".fifo"):
        raise InvalidInput(
            f"effect {name!r}: {queue_url!r} is not a FIFO queue URL (ending in .fifo); only "
            "FIFO queues deduplicate"
        )
    if isinstance(group_id, str):
        if not _SQS_ID.match(group_id):
            raise InvalidInput(
                f"effect {name!r}: group_id must be 1-128 alphanumeric or "
                f"punctuation characters, got {group_id!r}"
            )
    elif not callable(group_id):
        raise InvalidInput(f"effect {name!r}: group_id must be a string or a function")
    service = profiles.SQS_FIFO
    effect_contract(f"effect {name!r}", options, service, caller="sqs_fifo_effect",
                    spelling=FIXED)  # fmt: skip
    effective = _timeout(client, "sqs", options.get("timeout"), name)
    room = _policy_room(service, effective)
    if room <= 0:
        raise InvalidInput(
            f"effect {name!r}: the client may keep a request in flight for {effective:g}s, "
            f"which leaves no time inside SQS's {service.retention:g}s deduplication to wait "
            "it out and resend; build the client with tighter timeouts or fewer retries"
        )
    _hook(client, "sqs", "SendMessage")

    def submit(key: str, /, **fields: Any) -> dict[str, Any]:
        what = f"SendMessage to {queue_url}"
        body = _body(fields)
        group = group_id(_call_body(fields)) if callable(group_id) else group_id
        for label, value in (("key", key), ("group id", group)):
            if not isinstance(value, str) or not _SQS_ID.match(value):
                # Checked before anything is sent: not applied, so FAILED.
                raise Rejected(
                    f"effect {name!r}: {label} {value!r} is not a valid SQS id (1-128 "
                    "alphanumeric or punctuation characters)",
                    key=key,
                )
        try:
            answer, _ = _call(
                client,
                "send_message",
                name,
                QueueUrl=queue_url,
                MessageBody=body,
                MessageDeduplicationId=key,
                MessageGroupId=group,
            )
        except _Failed as failed:
            raise _outcome(failed, what, key) from failed.error
        if not isinstance(answer.get("MessageId"), str):
            raise AmbiguousResponse(f"{what}: the answer has no MessageId", key=key)
        return {"message_id": answer["MessageId"], "sequence_number": answer.get("SequenceNumber")}

    return Effect(
        name,
        submit,
        service=service,
        timeout=effective,
        receipt=receipt,
        store_args=store_args,
    )


# -- SES ------------------------------------------------------------------------------------


def ses_send_effect(
    client: Any,
    *,
    name: str,
    sender: str,
    configuration_set: str | None = None,
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect:
    """An Effect that sends one email with SES v2 ``SendEmail`` from ``sender`` (a verified
    identity): ``task.run(effect, to=[...], subject=..., text=... and/or html=..., cc=[...],
    bcc=[...], reply_to=[...])``. The receipt is ``{"message_id"}``.

    SES takes no idempotency key and has no way to ask whether a message was sent
    (:data:`intentlog.profiles.SES`): a call whose send may have started, i.e. the worker
    died after the intent was SUBMITTED, is UNRESOLVED and waits for a person; it is never
    sent again by itself. To help that person, the operation key rides in the message's
    ``Intentlog-Key`` header and, where the key is a valid tag value (letters, digits,
    ``_ - . @``, up to 256), in the message tag ``intentlog-key``, which SES event
    destinations (SNS, Firehose, CloudWatch) carry with every send and delivery event.
    ``configuration_set`` names the configuration set whose event destination records them.

    Outcomes as for every effect of this module: a definite refusal (an unverified sender,
    a bad address, the account's sending paused) -> :class:`intentlog.Rejected`, FAILED;
    otherwise :class:`AmbiguousResponse`, which for SES means UNRESOLVED. Arguments SES cannot
    take (no recipient, neither text nor html, an unknown argument) are refused before anything
    is sent.
    """
    _boto()
    if not isinstance(sender, str) or "@" not in sender:
        raise InvalidInput(f"effect {name!r}: sender must be an email address, got {sender!r}")
    if configuration_set is not None and (
        not isinstance(configuration_set, str) or not configuration_set
    ):
        raise InvalidInput(f"effect {name!r}: configuration_set must be a non-empty name")
    service = profiles.SES
    effect_contract(f"effect {name!r}", options, service, caller="ses_send_effect",
                    spelling=FIXED)  # fmt: skip
    effective = _timeout(client, "sesv2", options.get("timeout"), name)
    _hook(client, "sesv2", "SendEmail")

    def submit(key: str, /, **fields: Any) -> dict[str, Any]:
        what = f"SendEmail from {sender}"
        params = _ses_params(name, key, sender, configuration_set, fields)
        try:
            answer, _ = _call(client, "send_email", name, **params)
        except _Failed as failed:
            raise _outcome(failed, what, key) from failed.error
        if not isinstance(answer.get("MessageId"), str):
            raise AmbiguousResponse(f"{what}: the answer has no MessageId", key=key)
        return {"message_id": answer["MessageId"]}

    return Effect(
        name,
        submit,
        service=service,
        timeout=effective,
        receipt=receipt,
        store_args=store_args,
    )


_SES_FIELDS = frozenset({"to", "cc", "bcc", "reply_to", "subject", "text", "html"})
_SES_DESTINATIONS = (("to", "ToAddresses"), ("cc", "CcAddresses"), ("bcc", "BccAddresses"))


def _ses_params(
    name: str, key: str, sender: str, configuration_set: str | None, fields: dict[str, Any]
) -> dict[str, Any]:
    """SendEmail's parameters for one call; Rejected (nothing sent) for what SES cannot take."""

    def refuse(problem: str) -> Rejected:
        return Rejected(f"effect {name!r}: {problem}; nothing was sent", key=key)

    unknown = sorted(set(fields) - _SES_FIELDS)
    if unknown:
        raise refuse(f"unknown argument(s) {', '.join(unknown)} (takes {sorted(_SES_FIELDS)})")
    lists: dict[str, list[str]] = {}
    for field in ("to", "cc", "bcc", "reply_to"):
        value = fields.get(field, [])
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(a, str) and "@" in a for a in value):
            raise refuse(f"{field} must be an email address or a list of them, got {value!r}")
        lists[field] = value
    if not (lists["to"] or lists["cc"] or lists["bcc"]):
        raise refuse("no recipient (to, cc or bcc)")
    subject = fields.get("subject")
    if not isinstance(subject, str) or not subject:
        raise refuse("subject must be a non-empty string")
    body = {
        part.title(): {"Data": fields[part], "Charset": "UTF-8"}
        for part in ("text", "html")
        if fields.get(part) is not None
    }
    if not body or not all(isinstance(b["Data"], str) for b in body.values()):
        raise refuse("text or html (a string) is required")
    params: dict[str, Any] = {
        "FromEmailAddress": sender,
        "Destination": {kind: lists[field] for field, kind in _SES_DESTINATIONS if lists[field]},
        "Content": {
            "Simple": {
                "Subject": {"Data": subject, "Charset": "UTF-8"},
                "Body": body,
                "Headers": [{"Name": "Intentlog-Key", "Value": key}],
            }
        },
    }
    if lists["reply_to"]:
        params["ReplyToAddresses"] = lists["reply_to"]
    if _SES_TAG.match(key):
        params["EmailTags"] = [{"Name": "intentlog-key", "Value": key}]
    if configuration_set is not None:
        params["ConfigurationSetName"] = configuration_set
    return params


def _policy_room(service: Service, timeout: float) -> float:
    """Seconds between the end of a request's in-flight window and the last moment its key
    may be resent inside the service's retention (minus the margin)."""
    policy = Policy(idempotent=True, key_retention=service.key_retention, timeout=timeout)
    assert policy.key_retention is not None
    in_flight = send_slack(policy) + timeout
    return policy.key_retention - retention_margin(policy) - in_flight
