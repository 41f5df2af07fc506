// The Vercel AI SDK against a harmony-proxy that serves a scripted tool call, then the answer: generateText or
// streamText with a tool that executes, over @ai-sdk/openai-compatible or @ai-sdk/openai (chat or responses).
// Usage: node ai_sdk.mjs BASE_URL PROVIDER MODE (PROVIDER a key of PROVIDERS, MODE generate or stream).
// Prints {"result": {...}, "error": null or "..."} as one JSON line and exits 1 on an error;
// tests/test_ai_sdk.py checks the details and what the server was sent.
import assert from "node:assert/strict";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const MODEL = "openai/gpt-oss-20b";
const [baseURL, provider, mode] = [`${process.argv[2]}/v1`, process.argv[3], process.argv[4]];
// Each as users configure it for gpt-oss. @ai-sdk/openai sends reasoning options only to models it knows reason
// (o-series, gpt-5): `forceReasoning` tells it gpt-oss does. openai-compatible reads options under the camelCase
// provider name.
const openai = () => createOpenAI({ baseURL, apiKey: "unused" });
const REASONING = { forceReasoning: true, reasoningEffort: "low" };
const PROVIDERS = {
  "openai-compatible": () => ({
    model: createOpenAICompatible({ name: "harmony-proxy", baseURL, apiKey: "unused" }).chatModel(MODEL),
    providerOptions: { harmonyProxy: { reasoningEffort: "low" } },
  }),
  "openai-chat": () => ({ model: openai().chat(MODEL), providerOptions: { openai: REASONING } }),
  "openai-responses": () => ({
    model: openai().responses(MODEL),
    providerOptions: { openai: { ...REASONING, reasoningSummary: "auto" } },
  }),
  // Stateless (zero data retention): the SDK sends items back in full instead of item_reference, and asks for
  // include: ["reasoning.encrypted_content"].
  "openai-responses-store-false": () => ({
    model: openai().responses(MODEL),
    providerOptions: { openai: { ...REASONING, reasoningSummary: "auto", store: false } },
  }),
};

// An API error carries the server's status and body: keep them, they say what the server refused.
function describe(error) {
  const detail = error?.responseBody ? ` (${error.statusCode}: ${error.responseBody})` : "";
  return `${String(error)}${detail}`.slice(0, 2000);
}

function weatherTool(calls) {
  return tool({
    description: "Current weather for a city.",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      calls.push(city);
      return `sunny, 18 degrees in ${city}`;
    },
  });
}

async function runCase(calls, streamErrors) {
  const options = {
    ...PROVIDERS[provider](),
    tools: { get_weather: weatherTool(calls) },
    stopWhen: stepCountIs(3), // the call, then the answer; a third step would mean the loop did not end
    prompt: "What is the weather in Paris?",
    maxRetries: 0,
  };
  let result;
  let parts = null;
  if (mode === "generate") {
    result = await generateText(options);
  } else {
    result = streamText({ ...options, onError: ({ error }) => streamErrors.push(describe(error)) });
    parts = {};
    for await (const part of result.fullStream) parts[part.type] = (parts[part.type] ?? 0) + 1;
  }
  const steps = await result.steps;
  return {
    calls,
    parts,
    streamErrors,
    text: await result.text,
    steps: steps.map((step) => ({
      text: step.text,
      reasoning: step.reasoningText ?? null,
      finishReason: step.finishReason,
      toolCalls: step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
      toolResults: step.toolResults.map((result) => ({ name: result.toolName, output: result.output })),
    })),
  };
}

function check(summary) {
  assert.deepEqual(summary.streamErrors, [], "the stream reported errors");
  assert.deepEqual(summary.calls, ["Paris"], "the tool ran once, for Paris");
  assert.equal(summary.steps.length, 2, "two steps: the tool call, then the answer");
  assert.equal(summary.text, "It is 18C.");
}

const calls = [];
const streamErrors = [];
let result = null;
let error = null;
try {
  result = await runCase(calls, streamErrors);
  check(result);
} catch (caught) {
  error = [describe(caught), ...streamErrors].join("; ");
}
console.log(JSON.stringify({ result, error }));
process.exitCode = error ? 1 : 0;
