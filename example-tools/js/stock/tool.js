// `stock-js`: how many units of a SKU are available. Read-only: it cannot even link an effect.
// The JavaScript twin of example-tools/stock.

import { defineTool, config, http, Permanent, Transient } from '@oncebox/tool';

defineTool({
  name: 'stock-js',
  description: 'Tells how many units of a SKU are available.',
  class: 'read-only',
  args: {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    title: 'Args',
    type: 'object',
    properties: { sku: { type: 'string' } },
    required: ['sku'],
    additionalProperties: false,
  },

  /** @param {{sku: string}} args @returns {{sku: string, available: number}} */
  invoke({ sku }) {
    const base = config('base_url');
    if (base === undefined) throw new Permanent('config `base_url` is not set');
    // A read: no ledger entry, retried freely.
    const response = http.get(`${base}/inventory/${sku}`);
    if (!response.isSuccess()) throw new Transient(`inventory answered ${response.status}`);
    const stock = response.json();
    return { sku: stock.sku, available: stock.available };
  },
});
