// `thrower-js`: throws what its args say, the way a JavaScript tool's own bug does: an exception
// that is not one of the SDK's errors. Each must fail the attempt as a trap whose message carries
// what was thrown, never become a tool-error (tests/integration/languages.rs).

import { defineTool } from '@oncebox/tool';

defineTool({
  name: 'thrower-js',
  description: 'Throws a TypeError, a string, a plain object or an error carrying a payload.',
  class: 'read-only',
  args: {
    type: 'object',
    properties: { throw: { enum: ['type-error', 'string', 'object', 'payload'] } },
    required: ['throw'],
    additionalProperties: false,
  },

  invoke(args) {
    switch (args.throw) {
      case 'type-error':
        return args.missing.field;
      case 'string':
        throw 'a thrown string';
      case 'object':
        // Shaped like a tool-error: it must still be a bug, not a `permanent` answer.
        throw { tag: 'permanent', val: 'a plain object' };
      default: {
        const error = new Error('an error carrying a payload');
        error.payload = { tag: 'permanent', val: 'smuggled' };
        throw error;
      }
    }
  },
});
