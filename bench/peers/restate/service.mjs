// The Restate peer of oncebox's bench: one service, `Bench`, whose handler `charge` is one durable
// step (`ctx.run`) making one POST /payments to the example provider, the same request oncebox's
// `charge` tool makes, with an `Idempotency-Key` derived from the step: the invocation's id (the
// same on every retry of the invocation) and the step's name.
//
// `node service.mjs HOST PORT PROVIDER_URL`: serves the endpoint over HTTP/2 (cleartext) at
// HOST:PORT (0: a free port), where the Restate server is told to find it. Prints the port once it
// listens.

import * as http2 from "node:http2";

// The SDK uses `Promise.withResolvers` (Node.js 22); on Node.js 20 it is added here, as specified,
// before the SDK is loaded.
if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
const restate = await import("@restatedev/restate-sdk");

const [host, port, provider] = process.argv.slice(2);
if (!host || !port || !provider) {
  console.error("usage: node service.mjs HOST PORT PROVIDER_URL");
  process.exit(2);
}

const bench = restate.service({
  name: "Bench",
  handlers: {
    charge: async (ctx, order) => {
      const key = `restate-${ctx.request().id}-charge`;
      return ctx.run("charge", async () => {
        const response = await fetch(`${provider}/payments`, {
          method: "POST",
          headers: { "content-type": "application/json", "idempotency-key": key },
          body: JSON.stringify(order),
        });
        const body = await response.text();
        if (response.status >= 400 && response.status < 500 && response.status !== 409) {
          // The provider refused the request itself: retrying would not change its mind.
          throw new restate.TerminalError(`payments answered ${response.status}: ${body}`);
        }
        if (!response.ok) {
          // A 409 (the same key still in flight) or a 5xx: Restate retries the step, with the key.
          throw new Error(`payments answered ${response.status}: ${body}`);
        }
        return JSON.parse(body);
      });
    },
  },
});

// The bench holds this process's stdin open: when the bench ends, however it ends, so does this.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();

const server = http2.createServer(restate.endpoint().bind(bench).http2Handler());
server.listen(Number(port), host, () => console.log(String(server.address().port)));
