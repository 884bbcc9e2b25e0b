"""Service contracts of real services, as data: what each promises about idempotency keys.

Use one with an effect (``Effect(..., service=profiles.STRIPE)``) or adapt it
(``profiles.STRIPE.replace(timeout=10)``). Every number states its source and the date it was
read; services change their promises, so check the source when it matters, and declare your
own :class:`intentlog.Service` where yours differs. docs/services.md has the table.

Where a source does not say, the profile takes the safe side: a retention not stated counts
as not deduplicating, a lookup lag not stated lags as long as a request may take, a service
is not assumed to lock a key while a request runs, and no lookup is assumed that the source
does not describe. A ``timeout`` is the request deadline the client sets, not a promise of
the service: the value given is a reasonable deadline (the official SDK's default where one
is published), to be set to what your client really uses.
"""

from __future__ import annotations

import re
from datetime import timedelta

from intentlog._errors import InvalidInput
from intentlog._service import (
    FOREVER,
    AnswerError,
    KeyPlace,
    KeyReuse,
    Replay,
    Search,
    Service,
)
from intentlog._validate import seconds

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
    "slack",
]

_READ = "2026-12-01"  # the date the sources below were read, unless one says otherwise
_WIRE = "2026-12-04"  # the date the sources of how a body and a key are sent were read

STRIPE = Service(
    "stripe",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(hours=24),
    locks_in_flight=True,
    replay=Replay(header=("Idempotent-Replayed", "true")),
    lookup="reference",
    lookup_lag=timedelta(hours=1),
    timeout=80,
    encoding="form",
    reference=("metadata", "intentlog_key"),
    key_max_length=255,
    search=Search("{url}/search?query=metadata['intentlog_key']:'{key}'", results="data"),
    key_reuse=KeyReuse(statuses=(400,), member=("error", "type"), value="idempotency_error"),
    source=f"https://docs.stripe.com/api/idempotent_requests (read {_READ}): keys may be "
    "removed once at least 24 hours old; a retry with the same key returns the saved status "
    "and body; results are saved once the endpoint begins executing, and a request that "
    "conflicts with another executing concurrently with the same key is not executed. "
    f"https://docs.stripe.com/idempotency (read {_WIRE}): keys are up to 255 characters; "
    "the idempotency layer compares a retry's parameters with the first request's and "
    f"errors if they differ. https://docs.stripe.com/error-low-level (read {_WIRE}): a "
    "replayed answer carries the header Idempotent-Replayed: true; a request whose key is "
    "still in use by a concurrent request is answered 409 (error code "
    "idempotency_key_in_use, read here as in progress). "
    f"https://docs.stripe.com/api/errors (read {_WIRE}): error type idempotency_error, "
    "'an Idempotency-Key re-used on a request that does not match the first request's API "
    "endpoint and parameters' (a 400): read as KeyConflict. "
    f"https://docs.stripe.com/api (read {_WIRE}): v1 request bodies are form-encoded; "
    "nested values as stripe-python's _api_encode writes them (metadata[k]=v, arrays "
    "indexed). The key is also written to metadata[intentlog_key] and found with search: "
    f"https://docs.stripe.com/search (read {_WIRE}): the search API covers charges, "
    "customers, invoices, payment_intents, prices, products and subscriptions (this lookup "
    "fits effects that create those; for others pass lookup=), query "
    "metadata['key']:'value', results in data. "
    f"https://docs.stripe.com/api/customers/search (read {_READ}): searchable in under a "
    "minute normally, up to an hour behind during outages (the lag taken here). 80 s: the "
    "default request "
    "timeout of Stripe's official libraries (stripe-go, stripe-ruby).",
)

PAYPAL_ORDERS = Service(
    "paypal-orders-v2",
    key=KeyPlace.header("PayPal-Request-Id"),
    retention=timedelta(hours=6),
    timeout=60,
    reference=("purchase_units", 0, "custom_id"),
    key_max_length=108,
    source=f"https://developer.paypal.com/api/orders/v2/ (Create order, read {_READ}): "
    "PayPal-Request-Id: the server stores keys for 6 hours (up to 72 hours on request to "
    f"PayPal). https://developer.paypal.com/api/rest/reference/idempotency/ (read {_READ}): "
    "a repeated id returns the latest status of the first request; of two simultaneous "
    "requests with one id PayPal processes the first and might fail the second, which is "
    "no promise of a lock, so none is assumed. No lookup by request id is documented. "
    f"https://developer.paypal.com/docs/api/orders/v2/#orders_create (read {_WIRE}): "
    "PayPal-Request-Id is 1 to 108 characters; bodies are JSON; purchase_units[].custom_id "
    "is the caller's external id 'used to reconcile client transactions with PayPal "
    "transactions', shown in reports, not to the payer (invoice_id is shown to the payer "
    "and must be unique per invoice where the account blocks duplicate invoice ids), so "
    "the key is written to purchase_units[0].custom_id. Orders v2 has no search by "
    "custom_id, so no ready lookup; a reconciler of your own can read the transaction "
    "reports. Timeout: a client deadline chosen here.",
)

ADYEN = Service(
    "adyen",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(days=31),
    timeout=60,
    reference=("metadata", "intentlog_key"),
    key_max_length=64,
    source=f"https://docs.adyen.com/development-resources/api-idempotency/ (read {_READ}): "
    "keys are valid for a minimum of 31 days after first submission, per company account; "
    "keys are not checked across regional endpoints, so send every retry to the same "
    "region. How a concurrent request with the same key is answered was not found in the "
    f"public docs as of {_READ}: no lock in flight is assumed. "
    f"https://docs.adyen.com/development-resources/api-idempotency/ (read {_WIRE}): the "
    "key is a unique identifier with a maximum of 64 characters. "
    f"https://docs.adyen.com/api-explorer/Checkout/latest/post/payments (read {_WIRE}): "
    "bodies are JSON; metadata holds key-value pairs of the merchant's own, so the key is "
    "written to metadata.intentlog_key rather than to reference, which is the merchant's "
    "order reference that people and reports read. Adyen has no API to look a payment up "
    "by either, so no ready lookup (webhooks carry the metadata to a reconciler of your "
    "own). Timeout: a client deadline chosen here.",
)

SHOPIFY_GRAPHQL = Service(
    "shopify-graphql",
    key=KeyPlace.body("@idempotent(key:)"),
    retention=None,
    timeout=60,
    reference=("query",),
    marker='@idempotent(key: "{key}")',
    marker_place="graphql-directive",
    answer_errors=(
        AnswerError(
            ("extensions", "code"),
            errors=("errors",),
            transient=("INTERNAL_SERVER_ERROR",),
            ran=("data", "*"),
        ),
        AnswerError(("message",), errors=("data", "*", "userErrors")),
    ),
    source=f"https://shopify.dev/docs/api/usage/idempotent-requests (read {_READ}): "
    "mutations that support it take an @idempotent(key: ...) directive. "
    f"https://shopify.dev/docs/api/usage/implementing-idempotency (read {_READ}) speaks of a "
    f"retention window, but its length was not found in the public docs as of {_READ}: the "
    "key is not counted on across a crash. Timeout: a client deadline chosen here. "
    f"Wire (read {_WIRE}): the body is a JSON GraphQL request (query, variables); the "
    "directive goes on the mutation's field after its arguments, as in "
    'inventoryAdjustQuantities(input: {...}) @idempotent(key: "...") { ... } '
    "(https://shopify.dev/changelog/adding-idempotency-for-inventory-adjustments-and-refund-"
    "mutations; mandatory for those mutations from 2026-04: https://shopify.dev/changelog/"
    "making-idempotency-mandatory-for-inventory-adjustments-and-refund-mutations). Errors "
    "come as HTTP 200 with a top-level errors list: THROTTLED ('all requests that are made "
    "after the limit has been exceeded are throttled', https://shopify.dev/docs/api/usage/"
    "rate-limits; not executed: a refusal) and INTERNAL_SERVER_ERROR ('something went wrong "
    "on our end', as users report it: ambiguous); an error beside a mutation's data is "
    "ambiguous; a mutation's userErrors are a refusal "
    "(https://shopify.dev/docs/api/usage/response-codes). No lookup by the key.",
)

GITHUB = Service(
    "github-rest",
    key=KeyPlace.metadata("marker in the body"),
    lookup="reference",
    lookup_lag=timedelta(minutes=10),
    timeout=10,
    reference=("body",),
    marker="intentlog-key: {key}",
    search=Search(
        '../../../search/issues?q="{key}" repo:{segment[-3]}/{segment[-2]} in:body',
        results="items",
        incomplete="incomplete_results",
    ),
    source=f"https://docs.github.com/en/rest (read {_READ}): no idempotency key was found for "
    "creating issues or comments; a marker written into the body can be searched for "
    f"(https://docs.github.com/en/rest/search/search, read {_READ}). No lag of the search "
    "index is published; a GitHub answer (https://github.com/orgs/community/discussions/"
    f"52404, read {_READ}) says there is no SLO and it is typically a few minutes: 10 minutes "
    "is a margin chosen here, not a promise. Whether the search indexes HTML comments is not "
    "published and reports differ (https://github.com/JasonEtco/todo/issues/24: not indexed, "
    "2017; https://github.com/pfnet-research/alertmanager-to-github/pull/28: indexed on "
    f"github.com, not on GitHub Enterprise, 2022; both read {_WIRE}): write the marker as "
    "plain text. The marker 'intentlog-key: <key>' is the body's last paragraph; the "
    'search is GET /search/issues?q="<key>" repo:OWNER/REPO in:body, results in items '
    "(up to 1,000 per search, 30 searches a minute; incomplete_results is true when the "
    "search timed out, read as Indeterminate), and a match counts only where its body "
    f"holds the marker itself (https://docs.github.com/en/rest/search/search, read {_WIRE}). "
    "The search covers issues and pull requests (POST /repos/OWNER/REPO/issues or /pulls); "
    "it finds an issue by its comments but not the comment, so a comment effect needs a "
    f"lookup of its own. https://docs.github.com/en/rest/issues/issues (read {_WIRE}): "
    "bodies are JSON; 201 with the issue; 422 validation failed, 410 issues disabled; "
    "creating content quickly may meet secondary rate limits. Timeout: a client deadline "
    "chosen here.",
)

_SLACK_ERRORS = AnswerError(
    ("error",), ok=("ok",), transient=("internal_error", "fatal_error", "service_unavailable")
)

SLACK = Service(
    "slack",
    key=KeyPlace.metadata("message metadata"),
    lookup="reference",
    timeout=10,
    reference=("metadata", "event_payload", "intentlog_key"),
    pinned=((("metadata", "event_type"), "intentlog_operation"),),
    answer_errors=_SLACK_ERRORS,
    source=f"https://docs.slack.dev/reference/methods/chat.postMessage (read {_READ}): no "
    "idempotency argument was found; the key rides in the message's metadata (event_type, "
    "event_payload: "
    f"https://docs.slack.dev/messaging/message-metadata, read {_READ}) and is read back from "
    "conversations.history with include_all_metadata "
    f"(https://docs.slack.dev/reference/methods/conversations.history, read {_READ}). No lag "
    f"of the history behind a post was found in the public docs as of {_READ}: the lag is "
    "taken as the request timeout. Timeout: a client deadline chosen here. "
    f"Wire (read {_WIRE}): bodies are JSON; the key is written to "
    "metadata.event_payload.intentlog_key, with metadata.event_type intentlog_operation "
    "(a message's metadata has one event_type, so a call may not give another). Errors "
    "come as HTTP 200 with ok false and a code in error; of the errors common to Slack's "
    "methods, internal_error and fatal_error say 'it's possible some aspect of the "
    "operation succeeded before the error was raised' (https://api.slack.com/methods/"
    f"calls.info, read {_WIRE}), read as ambiguous, as is service_unavailable; any other "
    "code is a refusal. The history of one channel is the lookup: slack(channel) pins the "
    "channel and reads GET conversations.history?channel=...&include_all_metadata=true"
    "&limit=200, newest first; limit is at most 999 and fewer may come back before the end, "
    "has_more says more exist (https://docs.slack.dev/reference/methods/conversations."
    f"history, read {_WIRE}), so no match with has_more is Indeterminate.",
)


def slack(channel: str = "C0123456789") -> Service:
    """Slack's chat.postMessage to one channel, with its ready lookup: that channel's history.

    The history is read per channel, so the lookup needs it: the channel is pinned (written
    into each call, and a call naming another channel is refused before anything is sent)
    and read back with ``conversations.history`` (``include_all_metadata=true``, the 200
    newest messages; a message further back than that settles nothing: Indeterminate). Give
    the channel's id (``C...``), as the history takes: a channel name posts but does not
    read back. The default names no real channel; it is there so the profile table can show
    this function's row.
    """
    if not isinstance(channel, str) or not re.fullmatch(r"[A-Z0-9]{2,40}", channel):
        raise InvalidInput(
            f"slack(): channel must be a channel id such as 'C0123456789', got {channel!r}",
            option="channel",
        )
    return SLACK.replace(
        pinned=(*SLACK.pinned, (("channel",), channel)),
        search=Search(
            f"./conversations.history?channel={channel}&include_all_metadata=true&limit=200",
            results="messages",
            incomplete="has_more",
            listing=True,
        ),
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
    f"(read {_READ}): PutObject with If-None-Match: * fails with 412 Precondition Failed when "
    "an object with the key exists, for as long as it exists (a delete or a lifecycle rule "
    f"ends that). https://aws.amazon.com/s3/consistency/ (read {_READ}): strong "
    "read-after-write consistency for all reads, so HeadObject does not lag a write. "
    "Concurrent conditional writes may answer 409 ConditionalRequestConflict; no lock in "
    "flight is assumed. Timeout: a client deadline chosen here.",
)

SQS_FIFO = Service(
    "sqs-fifo",
    key=KeyPlace.message_id("MessageDeduplicationId"),
    retention=timedelta(minutes=5),
    timeout=20,
    source="https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/"
    f"FIFO-queues-exactly-once-processing.html (read {_READ}): a SendMessage retried within "
    "the 5-minute deduplication interval introduces no duplicate; SQS keeps tracking the "
    "id after the message was received and deleted. A sent message cannot be looked up by "
    "its id. Timeout: a client deadline chosen here.",
)

RESEND = Service(
    "resend",
    key=KeyPlace.header("Idempotency-Key"),
    retention=timedelta(hours=24),
    locks_in_flight=True,
    timeout=30,
    key_max_length=256,
    key_reuse=KeyReuse(statuses=(409,), member=("name",), value="invalid_idempotent_request"),
    source=f"https://resend.com/docs/dashboard/emails/idempotency-keys (read {_READ}): POST "
    "/emails and /emails/batch take an Idempotency-Key header; an email with the same key "
    "sent in the last 24 hours is not sent again and the same response is given. "
    f"The same page (read {_WIRE}): keys are 1 to 256 characters (else 400 "
    "invalid_idempotency_key); a key already used with a different payload is answered 409 "
    "invalid_idempotent_request (read as KeyConflict); 'another request with the same "
    "idempotency key is currently in progress' is answered 409 concurrent_idempotent_requests, "
    "safe to retry later: a lock in flight. "
    f"https://resend.com/docs/api-reference/errors (read {_WIRE}): errors are JSON with "
    "statusCode, name and message. Bodies are JSON. No email can be looked up by the key "
    "(GET /emails/{id} needs Resend's id), so no lookup. Timeout: a client deadline chosen "
    "here.",
)

SMTP = Service(
    "smtp",
    timeout=60,
    source=f"RFC 5321 (https://www.rfc-editor.org/rfc/rfc5321, read {_READ}): SMTP has no "
    "idempotency key and no way to ask whether a message was accepted; a message whose "
    "answer was lost is unknown. Timeout: a client deadline chosen here.",
)

SES = Service(
    "ses",
    timeout=30,
    source="https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html "
    f"(read {_READ}): the SendEmail request has no idempotency key or client token, and no "
    "message can be looked up by one of ours. Timeout: a client deadline chosen here.",
)


def nats_jetstream(duplicate_window: float | timedelta = 120.0, *, timeout: float = 5.0) -> Service:
    """NATS JetStream: ``Nats-Msg-Id`` is deduplicated within the stream's duplicate window.

    Pass the window the stream really has (its config's ``duplicate_window``; read it live,
    as the NATS integration does); 2 minutes is the server's default for a stream that sets
    none. Sources (read 2026-12-01): https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive
    and the server's ``StreamDefaultDuplicatesWindow = 2 * time.Minute``
    (https://github.com/nats-io/nats-server/blob/main/server/stream.go).
    """
    window = seconds("duplicate_window", duplicate_window, positive=True, bounded=False)
    return Service(
        "nats-jetstream",
        key=KeyPlace.message_id("Nats-Msg-Id"),
        retention=window,
        lookup="reference",
        lookup_lag=0,
        timeout=timeout,
        source="https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive "
        f"(read {_READ}): a message whose Nats-Msg-Id was seen within the stream's duplicate "
        "window is dropped and acknowledged as a duplicate; the window defaults to 2 minutes "
        "(StreamDefaultDuplicatesWindow in https://github.com/nats-io/nats-server/blob/main/"
        f"server/stream.go, read {_READ}). A stored message is read back from the stream "
        "itself, so the lookup does not lag.",
    )
