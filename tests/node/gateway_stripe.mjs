// A Stripe client as the official SDK (stripe-node) is one, sent through `intentlog gateway`
// (or straight at a Stripe fake, for the baseline): it creates one charge.
//
//   node gateway_stripe.mjs '{"url": "http://127.0.0.1:PORT", "task": "order-42",
//                             "step": "charge", "idempotency_key": null, "pause": false}'
//
// url: where stripe-node sends (its host, port and protocol: stripe-node takes no path
// prefix, so the gateway has a route "/v1" whose upstream ends in /v1). task and step go out
// as the Intentlog-Task and Intentlog-Step headers (a null one is not sent), through the
// request option `headers` (stripe-node's RequestOptions: "Specify additional request
// headers"). idempotency_key: the request option `idempotencyKey`; null leaves stripe-node to
// make its own, a random "stripe-node-retry-<uuid>" for every POST (RequestSender
// _defaultIdempotencyKey), so a restarted client sends a new one. amount: default 500.
//
// pause: once the charge was answered, write "paused after the charge" on stderr and wait
// for a line on stdin before printing, so a test can SIGKILL the client at that moment (after
// the service applied it, before the client could record anything) and start it again.
//
// Prints one JSON line: {"ok": true, "status", "charge": {"id", "amount", ...}, "headers":
// {the Intentlog-* and Idempotent-Replayed headers}, "idempotency_key": what stripe-node
// sent} and exits 0; else {"ok": false, "status", "error", "body", "headers", ...} and exits
// 1. stripe-node throws only for an error body with an "error" member (Stripe's shape): any
// other answer of 400 or more, a gateway's problem+json included, comes back as if it were
// the object, so the status is checked here.
import Stripe from "stripe";
import { intentlogHeaders, pause, print, readSpec, watched } from "./gateway_common.mjs";

const spec = readSpec();
const url = new URL(spec.url);
const stripe = new Stripe(spec.api_key ?? "sk_test_intentlog", {
  host: url.hostname,
  port: Number(url.port),
  protocol: url.protocol.replace(":", ""),
  maxNetworkRetries: 0, // one send per run: what a restart does is the test's subject
  telemetry: false,
});
// The key stripe-node sent (its "request" event): the one given, or the one it made.
let sentKey = null;
stripe.on("request", (event) => {
  sentKey = event.idempotency_key ?? null;
});

let charge;
try {
  const options = { headers: intentlogHeaders(spec) };
  if (spec.idempotency_key != null) options.idempotencyKey = spec.idempotency_key;
  charge = await stripe.charges.create(
    {
      amount: spec.amount ?? 500,
      currency: "usd",
      source: "tok_visa",
      metadata: { order: spec.task ?? "none" },
    },
    options,
  );
} catch (error) {
  const { headers: _headers, ...raw } = error?.raw ?? {};
  print({
    ok: false,
    status: error?.statusCode ?? null,
    error: String(error?.message ?? error),
    type: error?.type ?? null,
    body: error?.raw ? raw : null,
    headers: watched(error?.headers),
    idempotency_key: sentKey,
  });
  process.exit(1);
}
const response = charge.lastResponse;
if (spec.pause) await pause("the charge");
const { lastResponse: _, ...body } = charge;
if (response.statusCode >= 400) {
  print({
    ok: false,
    status: response.statusCode,
    error: `HTTP ${response.statusCode}`,
    body,
    headers: watched(response.headers),
    idempotency_key: sentKey,
  });
  process.exit(1);
}
print({
  ok: true,
  status: response.statusCode,
  charge: body,
  headers: watched(response.headers),
  idempotency_key: sentKey,
});
