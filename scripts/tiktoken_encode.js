// npm tiktoken (OpenAI's tokenizer as WASM) on one file: writes its GPT-2 ids as uint16 LE to OUT and
// prints "WALL_S CPU_S BYTES NTOK" for the encoding alone (file read and WASM set-up excluded).
// usage: node scripts/tiktoken_encode.js FILE OUT.u16   (needs `npm install --prefix . tiktoken`)
'use strict';
const fs = require('fs');
const path = require('path');
const { get_encoding } = require(path.join(__dirname, '..', 'node_modules', 'tiktoken'));
const [file, out] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf8');
const enc = get_encoding('gpt2');
const t0 = process.hrtime.bigint();
const c0 = process.cpuUsage();
const ids = enc.encode_ordinary(text);
const c1 = process.cpuUsage(c0);
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = (c1.user + c1.system) / 1e6;
enc.free();
fs.writeFileSync(out, Buffer.from(new Uint16Array(ids).buffer));
console.log(`${seconds} ${cpu} ${Buffer.byteLength(text, 'utf8')} ${ids.length}`);
