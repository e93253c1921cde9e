// The real nsqjs Reader finding nsqd through nsqlookupd, run by tests/compat/test_lookupd_discovery.py.
// Usage: node lookupd_scenarios.js <lookupd http host:port,...> <topic> <message count>
// Consumes (and finishes) <count> messages using only lookupdHTTPAddresses, then prints one JSON object:
// the bodies, the nsqd it connected to, and every error event. Exits 1 on timeout.
'use strict'

const nsq = require('nsqjs')

const [lookupds, topic, count] = [process.argv[2].split(','), process.argv[3], Number(process.argv[4])]
const errors = []
const connected = []
const WAIT_MS = 40000

const reader = new nsq.Reader(topic, 'nsqjs_lookupd', {
  lookupdHTTPAddresses: lookupds,
  lookupdPollInterval: 1,
  maxInFlight: 20,
})
reader.on('error', (err) => errors.push(`reader: ${err}`))
reader.on('nsqd_connected', (host, port) => connected.push(`${host}:${port}`))

const bodies = []
const done = new Promise((resolve) => {
  reader.on('message', (msg) => {
    bodies.push(msg.body.toString())
    msg.finish()
    if (bodies.length === count) resolve()
  })
})
const timer = setTimeout(() => {
  process.stderr.write(`timed out with ${bodies.length} of ${count} messages; connected: ${connected}\n`)
  process.exit(1)
}, WAIT_MS)
reader.connect()

done.then(() => {
  clearTimeout(timer)
  reader.close()
  process.stdout.write(JSON.stringify({ bodies, nsqd: connected.sort(), errors }) + '\n')
  process.exit(0)
})
