"""Service contracts of real services, as data: what each promises about idempotency keys.

Use one with an effect (``Effect(..., service=profiles.STRIPE)``) or adapt it
(``profiles.STRIPE.replace(timeout=10)``). Every number states its source and the date it was
read; services change their promises, so check the source when it matters, and declare your
own :class:`intentlog.Service` where yours differs. docs/services.md has the table.

Where a source does not say, the profile takes the safe side: a retention not stated counts
as not deduplicating, a lookup lag not stated lags as long as a request may take, and a
service is not assumed to lock a key while a request runs.
"""

from __future__ import annotations

from datetime import timedelta

from intentlog._service import FOREVER, KeyPlace, Replay, Service, seconds

__all__ = [
    "ADYEN",
    "GITHUB",
    "PAYPAL_ORDERS",
    "RESEND",
    "S3_CONDITIONAL",
    "SES",
    "SHOPIFY_GRAPHQL",
    "SLACK",
    "SMTP",
    "SQS_FIFO",
    "STRIPE",
    "nats_jetstream",
]

STRIPE = Service(
    "stripe",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(hours=24),
    locks_in_flight=True,
    replay=Replay(header=("Idempotent-Replayed", "true")),
    lookup="reference",
    lookup_lag=timedelta(minutes=1),
    timeout=80,
    source="https://docs.stripe.com/api/idempotent_requests (read 2026-12-01): keys may be "
    "removed once at least 24 hours old; a concurrent request with the same key gets 409; "
    "replays answer with the first result. Search by metadata lags up to a minute "
    "(https://docs.stripe.com/search). 80 s: stripe-python's default request timeout.",
)

PAYPAL_ORDERS = Service(
    "paypal-orders-v2",
    key=KeyPlace.header("PayPal-Request-Id"),
    retention=timedelta(hours=6),
    lookup="status",
    timeout=60,
    source="https://developer.paypal.com/api/rest/reference/idempotency/ (read 2026-12-01): "
    "Orders v2 keeps PayPal-Request-Id for 6 hours and replays the first response.",
)

ADYEN = Service(
    "adyen",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(days=31),
    timeout=60,
    source="https://docs.adyen.com/development-resources/api-idempotency/ (read 2026-12-01): "
    "keys are kept for a minimum of 31 days.",
)

SHOPIFY_GRAPHQL = Service(
    "shopify-graphql",
    key=KeyPlace.body("idempotencyKey"),
    retention=None,
    timeout=60,
    source="https://shopify.dev/docs/api/usage/idempotent-requests (read 2026-12-01): "
    "mutations take an @idempotent(key:) directive; no retention is published, so the key "
    "is not counted on across a crash.",
)

GITHUB = Service(
    "github-rest",
    key=KeyPlace.metadata("marker in the body"),
    lookup="reference",
    lookup_lag=timedelta(minutes=1),
    timeout=10,
    source="https://docs.github.com/en/rest (read 2026-12-01): no idempotency key; a marker "
    "written into the body can be searched for, and search lags behind writes.",
)

SLACK = Service(
    "slack",
    key=KeyPlace.metadata("message metadata"),
    lookup="reference",
    lookup_lag=timedelta(seconds=5),
    timeout=10,
    source="https://api.slack.com/methods/chat.postMessage (read 2026-12-01): no idempotency "
    "key; the key rides in message metadata and is read back from conversations.history.",
)

S3_CONDITIONAL = Service(
    "s3-conditional-put",
    key=KeyPlace("resource", "object key"),
    retention=FOREVER,
    replay=Replay(statuses=(412,)),
    lookup="key",
    lookup_lag=0,
    timeout=30,
    source="https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html "
    "(read 2026-12-01): PutObject with If-None-Match: * fails with 412 when the object exists; "
    "S3 reads are strongly consistent after a write, so HeadObject does not lag.",
)

SQS_FIFO = Service(
    "sqs-fifo",
    key=KeyPlace.message_id("MessageDeduplicationId"),
    retention=timedelta(minutes=5),
    timeout=20,
    source="https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/"
    "FIFO-queues-exactly-once-processing.html (read 2026-12-01): a deduplication id is "
    "honoured for 5 minutes; messages cannot be looked up.",
)

RESEND = Service(
    "resend",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(hours=24),
    timeout=30,
    source="https://resend.com/docs/dashboard/emails/idempotency-keys (read 2026-12-01): keys "
    "expire after 24 hours.",
)

SMTP = Service(
    "smtp",
    timeout=60,
    source="RFC 5321: no idempotency key and no lookup; a message sent in flight is unknown.",
)

SES = Service(
    "ses",
    timeout=30,
    source="https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html "
    "(read 2026-12-01): SendEmail takes no idempotency key and has no lookup by one.",
)


def nats_jetstream(duplicate_window: float | timedelta = 120.0, *, timeout: float = 5.0) -> Service:
    """NATS JetStream: ``Nats-Msg-Id`` is deduplicated within the stream's duplicate window
    (2 minutes unless the stream sets another; read it live from the stream's config).
    Source: https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive
    (read 2026-12-01)."""
    window = seconds(duplicate_window, "duplicate_window", allow_zero=False)
    return Service(
        "nats-jetstream",
        key=KeyPlace.message_id("Nats-Msg-Id"),
        retention=window,
        lookup="reference",
        lookup_lag=0,
        timeout=timeout,
        source="https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive "
        "(read 2026-12-01): messages with a Nats-Msg-Id seen within the duplicate window "
        "(default 2 minutes) are dropped and acknowledged as duplicates.",
    )
