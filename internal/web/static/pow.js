// seckill's proof of work for entering a draw (package draw, PowOK): find
// a nonce such that SHA-256(challenge + ":" + user id + ":" + nonce) starts
// with k zero bits. A small synchronous SHA-256 rather than
// crypto.subtle.digest: crypto.subtle exists only on https (or localhost),
// and a promise per hash is slower than the hash. The prefix's whole
// 64-byte blocks are hashed once; each try hashes the last block or two.
// The nonces are the decimal counter from 0, tried in batches between
// which the page stays responsive.
(function () {
  "use strict";

  var K = new Int32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  ]);
  var IV = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
  var w = new Int32Array(64);

  // compress hashes the 64 bytes of buf from off into the state h.
  function compress(h, buf, off) {
    var i, x, y;
    for (i = 0; i < 16; i++) {
      var j = off + 4 * i;
      w[i] = (buf[j] << 24) | (buf[j + 1] << 16) | (buf[j + 2] << 8) | buf[j + 3];
    }
    for (i = 16; i < 64; i++) {
      x = w[i - 15]; y = w[i - 2];
      w[i] = (w[i - 16] + (((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3)) + w[i - 7] +
        (((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10))) | 0;
    }
    var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (i = 0; i < 64; i++) {
      var t1 = (k + (((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))) +
        ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
      var t2 = ((((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))) +
        ((a & b) ^ (a & c) ^ (b & c))) | 0;
      k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h[0] = (h[0] + a) | 0; h[1] = (h[1] + b) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
    h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + k) | 0;
  }

  function utf8(s) { return new TextEncoder().encode(s); }

  // hasher hashes prefix + suffix for many suffixes: the prefix's whole
  // blocks once, then one call per suffix (an ASCII string).
  function hasher(prefix) {
    var p = utf8(prefix);
    var mid = Int32Array.from(IV);
    var whole = p.length - (p.length % 64);
    for (var off = 0; off < whole; off += 64) { compress(mid, p, off); }
    var tail = p.subarray(whole);
    var buf = new Uint8Array(192);
    var h = new Int32Array(8);
    return function (suffix) {
      buf.fill(0);
      buf.set(tail, 0);
      var n = tail.length;
      for (var i = 0; i < suffix.length; i++) { buf[n++] = suffix.charCodeAt(i); }
      buf[n] = 0x80;
      var blocks = Math.ceil((n + 9) / 64);
      var bits = (p.length + suffix.length) * 8;
      var end = blocks * 64;
      buf[end - 4] = bits >>> 24; buf[end - 3] = bits >>> 16; buf[end - 2] = bits >>> 8; buf[end - 1] = bits;
      h.set(mid);
      for (var b = 0; b < blocks; b++) { compress(h, buf, b * 64); }
      return h;
    };
  }

  // leadingZeros counts the zero bits a state starts with.
  function leadingZeros(h) {
    for (var i = 0; i < 8; i++) {
      if (h[i] !== 0) { return 32 * i + Math.clz32(h[i]); }
    }
    return 256;
  }

  // solve resolves to a nonce of k bits for user in the draw of
  // challenge; onBatch, when given, hears the tries so far.
  function solve(challenge, user, k, onBatch) {
    var hash = hasher(challenge + ":" + user + ":");
    var i = 0;
    var BATCH = 20000;
    return new Promise(function (resolve) {
      var step = function () {
        for (var end = i + BATCH; i < end; i++) {
          var nonce = String(i);
          if (leadingZeros(hash(nonce)) >= k) { resolve(nonce); return; }
        }
        if (onBatch) { onBatch(i); }
        setTimeout(step, 0);
      };
      step();
    });
  }

  // hex is the SHA-256 of s in hex (for checking this hash against
  // another).
  function hex(s) {
    var h = hasher(s)("");
    var out = "";
    for (var i = 0; i < 8; i++) { out += ("00000000" + (h[i] >>> 0).toString(16)).slice(-8); }
    return out;
  }

  window.seckillPow = { solve: solve, hex: hex, leadingZeros: leadingZeros };
})();
