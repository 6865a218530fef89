/**
 * Realistic payloads (BENCH.md: "1.5 KB beside the no-op ones"): a nested
 * JSON document of strings and numbers, like an order or a notification a
 * real task carries. Built once, deterministically (no randomness), so every
 * system stores the same bytes; only the task's index `i` (and a workload's
 * clocks) differ from task to task.
 */
import type { Payload } from '../adapters/types.js';

const cache = new Map<number, Record<string, unknown>>();

/** A document whose JSON is `bytes` long (± a few bytes), the same for every call with the same size. */
export function document(bytes: number): Record<string, unknown> {
  let doc = cache.get(bytes);
  if (doc) return doc;
  const items: Record<string, unknown>[] = [];
  doc = {
    kind: 'order.created',
    version: 3,
    tenant: { id: 'tn_5f2c9a41', plan: 'business', region: 'eu-west-1' },
    customer: {
      id: 'cus_81d3b7e2c4',
      name: 'Margarethe Oyelaran-Whitcombe',
      email: 'm.oyelaran-whitcombe@example.org',
      locale: 'de-AT',
      address: { line1: 'Schönbrunner Straße 187/4', city: 'Wien', postcode: '1120', country: 'AT' },
      tags: ['returning', 'newsletter', 'b2b'],
    },
    items,
    totals: { currency: 'EUR', subtotal: 0, tax: 0, shipping: 4.9, total: 0 },
    shipping: { method: 'parcel-standard', carrier: 'post-at', eta_days: 3 },
    trace: { request_id: 'req_0c8f1e7a9b2d4c6e', source: 'checkout-web', attempt: 1 },
  };
  const size = () => JSON.stringify({ i: 0, doc }).length;
  for (let k = 0; size() < bytes; k++) {
    const qty = 1 + (k % 4);
    const price = Math.round((7.5 + ((k * 37) % 113) + ((k * 13) % 100) / 100) * 100) / 100;
    items.push({
      sku: `SKU-${(104729 * (k + 1)) % 1000003}`,
      title: `Item ${k + 1}: ${['enamel mug', 'linen towel', 'oak tray', 'wool throw', 'brass hook'][k % 5]}`,
      qty,
      price,
    });
    const totals = doc.totals as Record<string, number>;
    totals.subtotal = Math.round(items.reduce((s, it) => s + (it.qty as number) * (it.price as number), 0) * 100) / 100;
    totals.tax = Math.round(totals.subtotal * 0.2 * 100) / 100;
    totals.total = Math.round((totals.subtotal + totals.tax + totals.shipping!) * 100) / 100;
  }
  // Trim the overshoot of the last item with a note, so the size is close to `bytes`.
  const over = size() - bytes;
  if (over > 0 && items.length > 1) {
    items.pop();
    const note = size() + ',"note":""'.length;
    doc.note = 'Please leave the parcel with the neighbours at door 3 if nobody answers; ring twice. '.repeat(40).slice(0, Math.max(0, bytes - note));
  }
  cache.set(bytes, doc);
  return doc;
}

/** Task `i`'s payload: `{ i }` alone, or with a `doc` of `bytes` bytes of JSON. */
export function payload(i: number, bytes = 0): Payload {
  return bytes > 0 ? { i, doc: document(bytes) } : { i };
}
