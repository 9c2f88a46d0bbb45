// An independent reader of TensorBoard event files for tests/system/t_monitors.sh: the TFRecord framing and
// its masked CRC-32C checked here (CRC-32C written from its definition, checked against the standard check
// value), each record decoded as a tensorboard Event by npm's protobufjs (from .npm/, installed by
// scripts/install_deps.sh test) with the message definitions of TensorBoard's event.proto and summary.proto.
//   node tests/tools/tfevents_read.js EVENTS_FILE
//       prints one JSON object: {"version": the first record's file_version, "first_step": whether the first
//       record has a step, "records": N, "scalars": [[step, tag, value], ...] in file order}; exit 1 with a
//       line naming the problem on a bad length, CRC or message.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const local = createRequire(path.join(__dirname, '..', '..', '.npm', 'package.json'));
const protobuf = local('protobufjs');

const PROTO = `
syntax = "proto3";
message SummaryValue { string tag = 1; float simple_value = 2; }
message Summary { repeated SummaryValue value = 1; }
message Event {
    double wall_time = 1;
    int64 step = 2;
    oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5; }
}`;

const CRC_TABLE = (() => {
    const t = new Uint32Array(256);
    for (let i = 0; i < 256; i++) {
        let c = i;
        for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
        t[i] = c >>> 0;
    }
    return t;
})();

function crc32c(buf) {
    let c = 0xffffffff;
    for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
}

function masked(buf) {
    const c = crc32c(buf);
    return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

function die(msg) {
    console.error(`error: ${msg}`);
    process.exit(1);
}

function main() {
    if (crc32c(Buffer.from('123456789')) !== 0xe3069283) die('crc32c("123456789") is not 0xE3069283');
    const Event = protobuf.parse(PROTO, { keepCase: true }).root.lookupType('Event');
    const file = fs.readFileSync(process.argv[2]);
    const out = { version: null, first_step: null, records: 0, scalars: [] };
    for (let at = 0; at < file.length; out.records++) {
        if (at + 12 > file.length) die(`a record header is cut at byte ${at}`);
        const len = Number(file.readBigUInt64LE(at));
        if (masked(file.subarray(at, at + 8)) !== file.readUInt32LE(at + 8)) die(`length CRC mismatch at byte ${at}`);
        const data = file.subarray(at + 12, at + 12 + len);
        if (data.length !== len || at + 16 + len > file.length) die(`a record is cut at byte ${at}`);
        if (masked(data) !== file.readUInt32LE(at + 12 + len)) die(`data CRC mismatch at byte ${at}`);
        at += 16 + len;
        const ev = Event.decode(data);
        if (out.records === 0) {
            out.version = ev.file_version;
            out.first_step = Object.prototype.hasOwnProperty.call(ev, 'step') && Number(ev.step) !== 0;
            continue;
        }
        for (const v of (ev.summary && ev.summary.value) || []) out.scalars.push([Number(ev.step), v.tag, v.simple_value]);
    }
    console.log(JSON.stringify(out));
}

main();
