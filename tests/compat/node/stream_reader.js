// The real nsqjs Reader finding nsqd through nsqlookupd and running until it is killed, for the replication ring
// test (tests/compat/test_replication_ring.py).
// Usage: node stream_reader.js <lookupd http host:port> <topic> <channel>
// Prints each message body on its own line before it finishes the message.
'use strict'

const nsq = require('nsqjs')

const [lookupd, topic, channel] = process.argv.slice(2, 5)
const reader = new nsq.Reader(topic, channel, {
  lookupdHTTPAddresses: [lookupd],
  lookupdPollInterval: 1,
  maxInFlight: 20,
})
reader.on('error', () => {}) // nodes die on purpose in this test
reader.on('nsqd_closed', () => {})
reader.on('message', (msg) => {
  process.stdout.write(msg.body.toString() + '\n')
  msg.finish()
})
reader.connect()
