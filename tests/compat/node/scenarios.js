// Scenarios for the real nsqjs client, run one per process by tests/compat/test_nsqjs.py.
// Usage: node scenarios.js <scenario> <nsqd host:port> <topic>
// Prints one JSON object (what the client saw, plus every error event) and exits 0; exits 1 on timeout.
'use strict'

const nsq = require('nsqjs')

const [scenario, address, topic] = process.argv.slice(2)
const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))]
const errors = []
const WAIT_MS = 20000

function describe(msg) {
  return {
    id: msg.id,
    body: msg.body.toString(),
    attempts: msg.attempts,
    timestamp: String(msg.timestamp),
  }
}

function withTimeout(promise, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), WAIT_MS)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

async function connectedWriter() {
  const writer = new nsq.Writer(host, port)
  writer.on('error', (err) => errors.push(`writer: ${err}`))
  const ready = new Promise((resolve) => writer.on('ready', resolve))
  writer.connect()
  await withTimeout(ready, 'writer ready')
  return writer
}

function publish(writer, method, ...args) {
  return withTimeout(
    new Promise((resolve) => writer[method](...args, (err) => resolve(err ? `error: ${err}` : 'OK'))),
    `writer.${method}`
  )
}

// A Reader whose messages arrive in a queue the scenario awaits one by one.
function queuedReader(options, onMessage) {
  const reader = new nsq.Reader(topic, 'nsqjs', { nsqdTCPAddresses: [address], ...options })
  const waiting = []
  const arrived = []
  reader.on('error', (err) => errors.push(`reader: ${err}`))
  reader.on('message', (msg) => {
    onMessage(msg)
    const item = describe(msg)
    if (waiting.length) waiting.shift()(item)
    else arrived.push(item)
  })
  reader.connect()
  reader.next = (what = 'message') =>
    withTimeout(new Promise((resolve) => (arrived.length ? resolve(arrived.shift()) : waiting.push(resolve))), what)
  reader.pending = arrived
  return reader
}

const scenarios = {
  async publish_consume_finish() {
    const writer = await connectedWriter()
    const pub = await publish(writer, 'publish', topic, 'hello from nsqjs')
    const reader = queuedReader({ maxInFlight: 1, messageTimeout: 1000 }, (msg) => msg.finish())
    const first = await reader.next()
    await sleep(2500) // msg_timeout is 1 s: an unfinished message would be back by now
    const redelivered = reader.pending.splice(0)
    reader.close()
    writer.close()
    return { pub, first, redelivered }
  },

  async requeue() {
    const writer = await connectedWriter()
    const pub = await publish(writer, 'publish', topic, 'requeue me')
    const reader = queuedReader({ maxInFlight: 1 }, (msg) => {
      if (msg.attempts === 1) msg.requeue(1000, false)
      else msg.finish()
    })
    const first = await reader.next('first delivery')
    const second = await reader.next('requeued delivery')
    reader.close()
    writer.close()
    return { pub, first, second }
  },

  async mpub_and_defer() {
    const writer = await connectedWriter()
    // nsqjs 0.13.0's deferPublish only accepts a one-element array (a bare string throws inside the client)
    const deferred = await publish(writer, 'deferPublish', topic, ['deferred'], 2000)
    const batch = []
    for (let i = 0; i < 100; i++) batch.push(`batch-${i}`)
    const mpub = await publish(writer, 'publish', topic, batch)
    const reader = queuedReader({ maxInFlight: 25 }, (msg) => msg.finish())
    const bodies = []
    for (let i = 0; i < 101; i++) bodies.push((await reader.next(`message ${i}`)).body)
    reader.close()
    writer.close()
    return { deferred, mpub, bodies }
  },

  async touch() {
    const writer = await connectedWriter()
    const pub = await publish(writer, 'publish', topic, 'touch me')
    let held = null
    const reader = queuedReader({ maxInFlight: 2, messageTimeout: 1000 }, (msg) => {
      if (held === null) held = msg
    })
    const first = await reader.next()
    for (let i = 0; i < 8; i++) {
      await sleep(400) // 3.2 s of work against a 1 s msg_timeout
      held.touch()
    }
    const redelivered = reader.pending.splice(0)
    held.finish()
    await sleep(1500)
    redelivered.push(...reader.pending.splice(0))
    reader.close()
    writer.close()
    return { pub, first, redelivered }
  },
}

scenarios[scenario]()
  .then((result) => {
    result.errors = errors
    process.stdout.write(JSON.stringify(result) + '\n')
    process.exit(0)
  })
  .catch((err) => {
    process.stderr.write(`${err.stack || err}\nerrors: ${JSON.stringify(errors)}\n`)
    process.exit(1)
  })
