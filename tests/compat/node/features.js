// nsqjs with nsqd's connection features, one run per process (tests/compat/test_features_nsqjs.py).
// Usage: node features.js <options JSON> <nsqd host:port> <topic>
// options: {"tls": <CA file>, "cert": <client key+cert PEM>, "snappy": bool, "deflate": <level>, "authSecret": str}
// A Writer publishes single messages and a batch, a Reader consumes and finishes them all, both with the options.
// Prints one JSON object (the IDENTIFY and AUTH answers the Writer saw, the bodies, every error event); exits 1 on timeout.
'use strict'

const fs = require('fs')
const nsq = require('nsqjs')

const [optionsJson, address, topic] = process.argv.slice(2)
const options = JSON.parse(optionsJson)
const host = address.slice(0, address.lastIndexOf(':'))
const port = Number(address.slice(address.lastIndexOf(':') + 1))
const errors = []
const WAIT_MS = 20000

function withTimeout(promise, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), WAIT_MS)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

function connectionOptions() {
  const config = {}
  if (options.tls) {
    config.tls = true
    config.tlsVerification = true
    config.ca = fs.readFileSync(options.tls)
  }
  if (options.cert) {
    config.key = fs.readFileSync(options.cert)
    config.cert = fs.readFileSync(options.cert)
  }
  if (options.snappy) config.snappy = true
  if (options.deflate) {
    config.deflate = true
    config.deflateLevel = options.deflate
  }
  if (options.authSecret) config.authSecret = options.authSecret
  return config
}

async function main() {
  const writer = new nsq.Writer(host, port, connectionOptions())
  writer.on('error', (err) => errors.push(`writer: ${err}`))
  const ready = new Promise((resolve) => writer.on('ready', resolve))
  writer.connect()
  await withTimeout(ready, 'writer ready')
  const identify = writer.conn.statemachine.identifyResponse
  const auth = writer.conn.auth || null

  const singles = []
  for (let i = 0; i < 5; i++) singles.push(`single ${i} `.repeat(40))
  const batch = []
  for (let i = 0; i < 40; i++) batch.push(`batch ${i} `.repeat(i + 1))
  batch.push('big'.repeat(30000))
  const answers = []
  const publish = (body) =>
    withTimeout(new Promise((resolve) => writer.publish(topic, body, (err) => resolve(err ? `error: ${err}` : 'OK'))),
      'publish')
  for (const body of singles) answers.push(await publish(body))
  answers.push(await publish(batch))

  const expected = singles.concat(batch)
  const bodies = []
  const reader = new nsq.Reader(topic, 'features', {
    nsqdTCPAddresses: [address], maxInFlight: 20, ...connectionOptions(),
  })
  reader.on('error', (err) => errors.push(`reader: ${err}`))
  const all = new Promise((resolve) => {
    reader.on('message', (msg) => {
      bodies.push(msg.body.toString())
      msg.finish()
      if (bodies.length === expected.length) resolve()
    })
  })
  reader.connect()
  await withTimeout(all, `all ${expected.length} messages`)
  reader.close()
  writer.close()
  const complete = JSON.stringify(bodies.slice().sort()) === JSON.stringify(expected.slice().sort())
  return { identify, auth, answers, complete, received: bodies.length }
}

main()
  .then((result) => {
    result.errors = errors
    process.stdout.write(JSON.stringify(result) + '\n')
    process.exit(0)
  })
  .catch((err) => {
    process.stderr.write(`${err.stack || err}\nerrors: ${JSON.stringify(errors)}\n`)
    process.exit(1)
  })
