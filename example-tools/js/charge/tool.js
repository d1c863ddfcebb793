// `charge-js`: charges an order once. Compensatable (undone by `refund`), reconciles by effect key.
// The JavaScript twin of example-tools/charge.

import { defineTool, config, http, lookup, Permanent, STILL_UNKNOWN } from '@oncebox/tool';

function baseUrl() {
  const base = config('base_url');
  if (base === undefined) throw new Permanent('config `base_url` is not set');
  return base;
}

/**
 * The output, from what the payments API answers.
 * @param {{id: string, order_id: string, amount_cents: number, status: string}} body
 */
function payment({ id, order_id, amount_cents, status }) {
  if (typeof id !== 'string' || typeof amount_cents !== 'number') throw new Permanent('invalid JSON: not a payment');
  return { id, order_id, amount_cents, status };
}

defineTool({
  name: 'charge-js',
  description: "Charges an order's payment method once.",
  class: 'compensatable',
  args: {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    title: 'Args',
    type: 'object',
    properties: {
      order_id: { type: 'string' },
      amount_cents: { type: 'integer', minimum: 0 },
      currency: { type: 'string' },
      payment_method: { type: 'string' },
    },
    required: ['order_id', 'amount_cents', 'currency', 'payment_method'],
    additionalProperties: false,
  },
  compensatedBy: 'refund',
  // refund's args, made by the host from this operation's when it compensates.
  compensationArgs: { order_id: '/args/order_id', amount_cents: '/output/amount_cents' },
  // Never in logs or records.
  sensitive: ['/payment_method'],

  invoke(args) {
    // The host sends `Idempotency-Key` and records the answer: a retry never charges twice.
    const response = http.postJson('charge', `${baseUrl()}/payments`, args);
    if (response.isSuccess()) return payment(response.json());
    if (response.status === 402) throw new Permanent('card declined');
    throw new Permanent(`payments answered ${response.status}`);
  },

  // The effect's answer was lost: ask the provider whether it knows the key. `effectKey` is the
  // `Idempotency-Key` the host sent; the lookup is a GET, under the tool's http grant.
  reconcile(effectKey, _args) {
    const base = config('base_url');
    if (base === undefined) return STILL_UNKNOWN;
    return lookup(`${base}/payments/by-key/${effectKey}`, payment);
  },
});
