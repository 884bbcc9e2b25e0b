// An agent on the Vercel AI SDK (`ai`): generateText with one tool, charge_card, whose execute
// POSTs a Stripe charge through `intentlog gateway` with fetch. The model is the SDK's own
// mock (MockLanguageModelV4 from "ai/test", no network): scripted to call charge_card once,
// then to answer with what the tool returned, which is how a test sees what the model read.
//
//   node gateway_ai_agent.mjs '{"url": "http://127.0.0.1:PORT/stripe", "task": "order-42",
//                               "order": "42", "amount": 500, "pause": false}'
//
// url: the gateway route's prefix (the tool POSTs url + "/v1/charges", form-encoded as Stripe
// takes it). The tool sends Intentlog-Task: task and Intentlog-Step: "charge:" + order, the
// operation named by what it does, not by the model's tool-call id (a real model makes a new
// one on every run, so a restarted agent would be a new operation).
//
// The tool gives the model every answer, an error included, as its result: {"status",
// "headers" (the Intentlog-* ones), "body"}; a 409 UNRESOLVED problem+json from the gateway
// reaches the model as it came. A request that got no answer (the gateway died) makes execute
// throw, which the SDK hands the model as a tool error.
//
// pause: once the gateway answered, write "paused after the charge" on stderr and wait for a
// line on stdin before the tool returns (the test SIGKILLs the agent there and starts it
// again).
//
// Prints one JSON line {"ok", "status", "tool_result", "model_read", "text"} and exits 0 once
// the run ended: ok is true when the charge was answered below 400; tool_result is what
// execute returned (or {"error": message} where it threw), model_read the tool output the
// model was given in its next prompt, text the model's last answer. Exits 1 if the run
// itself failed.
import { generateText, isStepCount, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { intentlogHeaders, pause, print, readSpec, watched } from "./gateway_common.mjs";

const spec = readSpec();
const order = spec.order ?? "42";
const amount = spec.amount ?? 500;

const USAGE = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** The tool output the model is given in this prompt, or undefined before any tool ran. */
function toolOutput(prompt) {
  for (const message of prompt) {
    if (message.role !== "tool") continue;
    for (const part of message.content) {
      if (part.type === "tool-result") return part.output;
    }
  }
  return undefined;
}

let modelRead;
const model = new MockLanguageModelV4({
  doGenerate: async ({ prompt }) => {
    const output = toolOutput(prompt);
    if (output === undefined) {
      const input = JSON.stringify({ order, amount_cents: amount });
      return {
        content: [{ type: "tool-call", toolCallId: "call-1", toolName: "charge_card", input }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage: USAGE,
        warnings: [],
      };
    }
    modelRead = output;
    return {
      content: [{ type: "text", text: `charge_card answered: ${JSON.stringify(output)}` }],
      finishReason: { unified: "stop", raw: undefined },
      usage: USAGE,
      warnings: [],
    };
  },
});

let toolResult;
const chargeCard = tool({
  description: "Charge the customer's card for an order, in cents.",
  inputSchema: z.object({ order: z.string(), amount_cents: z.number().int().positive() }),
  execute: async ({ order, amount_cents }) => {
    const body = new URLSearchParams({
      amount: String(amount_cents),
      currency: "usd",
      source: "tok_visa",
      "metadata[order]": order,
    });
    let response;
    try {
      response = await fetch(`${spec.url}/v1/charges`, {
        method: "POST",
        headers: {
          Authorization: `Bearer ${spec.api_key ?? "sk_test_intentlog"}`,
          "Content-Type": "application/x-www-form-urlencoded",
          ...intentlogHeaders({ task: spec.task, step: `charge:${order}` }),
        },
        body: body.toString(),
      });
    } catch (error) {
      toolResult = { error: String(error?.cause?.message ?? error?.message ?? error) };
      throw new Error(`the charge got no answer: ${toolResult.error}`);
    }
    const text = await response.text();
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
    toolResult = { status: response.status, headers: watched(response.headers), body: parsed };
    if (spec.pause) await pause("the charge");
    return toolResult;
  },
});

let result;
try {
  result = await generateText({
    model,
    tools: { charge_card: chargeCard },
    stopWhen: isStepCount(3),
    prompt: `Charge ${amount} cents for order ${order}.`,
  });
} catch (error) {
  print({ ok: false, error: String(error?.message ?? error), tool_result: toolResult ?? null });
  process.exit(1);
}
print({
  ok: toolResult?.status !== undefined && toolResult.status < 400,
  status: toolResult?.status ?? null,
  tool_result: toolResult ?? null,
  model_read: modelRead ?? null,
  text: result.text,
});
