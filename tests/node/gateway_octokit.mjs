// A GitHub client as Octokit (@octokit/rest) is one, sent through `intentlog gateway` (or
// straight at a GitHub fake, for the baseline): it opens one issue.
//
//   node gateway_octokit.mjs '{"url": "http://127.0.0.1:PORT/github", "task": "bug-7",
//                              "step": "open-issue", "idempotency_key": null, "pause": false}'
//
// url: Octokit's baseUrl (a gateway route's prefix, or the fake itself). task and step go out
// as the Intentlog-Task and Intentlog-Step headers (a null one is not sent) through the
// request's own `headers` parameter (Octokit: every endpoint method takes `headers`);
// idempotency_key, when given, as Idempotency-Key (GitHub takes no key: to the gateway it is
// the operation's identity on a route without a key header). owner, repo, title, body:
// the issue (defaults below).
//
// pause: once the issue was answered, write "paused after the issue" on stderr and wait for a
// line on stdin before printing (the test SIGKILLs the client there and starts it again).
//
// Prints one JSON line: {"ok": true, "status", "issue": {...}, "headers": {the Intentlog-*
// headers}} and exits 0; else {"ok": false, "status", "error", "body", "headers"} and exits 1
// (Octokit throws a RequestError for any answer of 400 or more).
import { Octokit } from "@octokit/rest";
import { intentlogHeaders, pause, print, readSpec, watched } from "./gateway_common.mjs";

const spec = readSpec();
const octokit = new Octokit({
  auth: spec.token ?? "ghp_intentlog",
  baseUrl: spec.url,
  log: { debug() {}, info() {}, warn() {}, error() {} },
});

const headers = intentlogHeaders(spec);
if (spec.idempotency_key != null) headers["Idempotency-Key"] = spec.idempotency_key;

let response;
try {
  response = await octokit.rest.issues.create({
    owner: spec.owner ?? "acme",
    repo: spec.repo ?? "shop",
    title: spec.title ?? "Checkout fails for order 42",
    body: spec.body ?? "Reported by the support agent.",
    headers,
  });
} catch (error) {
  print({
    ok: false,
    status: error?.status ?? null,
    error: String(error?.message ?? error),
    body: error?.response?.data ?? null,
    headers: watched(error?.response?.headers),
  });
  process.exit(1);
}
if (spec.pause) await pause("the issue");
print({ ok: true, status: response.status, issue: response.data, headers: watched(response.headers) });
