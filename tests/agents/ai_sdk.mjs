// An AI SDK agent, as its docs show one: a provider given a base URL and a key, a model name,
// one tool, a step limit; then a second user turn on the messages the first run returned (a
// chat app's conversation). argv: chat | responses | anthropic, then generate | stream. The
// base URL comes in $BASE_URL; the answers are printed as one JSON line.
import { readFileSync } from "node:fs";
import { generateText, streamText, stepCountIs, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { z } from "zod";

const [kind, mode] = process.argv.slice(2);
const baseURL = process.env.BASE_URL;
const model =
  kind === "anthropic"
    ? createAnthropic({ baseURL, apiKey: "sk-unused" })("smollm2")
    : kind === "chat"
      ? createOpenAI({ baseURL, apiKey: "sk-unused" }).chat("smollm2")
      : createOpenAI({ baseURL, apiKey: "sk-unused" }).responses("smollm2");

const task = "Read the file note.txt in this directory and tell me the word in it.";
const run = {
  model,
  tools: {
    read_note: tool({
      description: "Read a text file in the working directory.",
      inputSchema: z.object({ path: z.string() }),
      execute: async ({ path }) => readFileSync(path, "utf8"),
    }),
  },
  stopWhen: stepCountIs(4),
  maxRetries: 0,
};

async function turn(messages) {
  if (mode === "stream") {
    const result = streamText({ ...run, messages, onError: ({ error }) => { throw error; } });
    for await (const _ of result.fullStream) {
    }
    return { text: await result.text, steps: (await result.steps).length,
             messages: (await result.response).messages };
  }
  const result = await generateText({ ...run, messages });
  return { text: result.text, steps: result.steps.length, messages: result.response.messages };
}

const history = [{ role: "user", content: task }];
const first = await turn(history);
history.push(...first.messages, { role: "user", content: "Thanks. Say it once more." });
const second = await turn(history);
console.log(JSON.stringify([first, second].map(({ text, steps }) => ({ text, steps }))));
