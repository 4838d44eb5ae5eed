// The GPT demo page: the worker (worker.js) trains and samples; this page
// charts the loss, shows the samples as they come, and moves checkpoints.
import { startWorker, showDevice, watchEventLoop, drawChart, checkpointButtons } from '../lib/page.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// State the browser tests read.
const demo = (window.kilnDemo = { state: 'loading', losses: [], samples: [], device: null, maxGapMs: 0, checkpoint: null });
// Watched from the first step's result on: start-up (wasm compile, the WebGPU self-test) happens before.
watchEventLoop(demo, () => demo.state === 'training' && demo.losses.length > 0);

const rpc = startWorker(new URL('worker.js', import.meta.url));
const status = (text) => { $('status').textContent = text; };
const fail = (e) => { demo.state = 'error'; demo.error = e.message; status(`error: ${e.message}`); };
const showSample = (title, text) => { $('sample').textContent = `${title}\n\n${text}`; };
rpc.on('error', (e) => fail(new Error(e.error)));
rpc.on('progress', (p) => {
  demo.losses.push(p.loss);
  status(`step ${p.step} · loss ${p.loss.toFixed(4)} · ${p.seconds.toFixed(1)} s`);
  drawChart($('chart'), demo.losses, [], 4.5);
});
rpc.on('sample', (s) => {
  demo.samples.push(s);
  showSample(`after step ${s.step}:`, s.text);
});

const controls = (busy) => {
  for (const id of ['train', 'reset', 'download', 'upload', 'generate']) $(id).disabled = busy;
  $('stop').disabled = !busy;
};

async function train() {
  demo.state = 'training';
  controls(true);
  try {
    const result = await rpc.call('train', {
      steps: Number(params.get('steps') || $('steps').value), batch: Number($('batch').value),
      sampleEvery: Number(params.get('sampleEvery') || $('every').value), sampleLength: Number(params.get('sampleLength') || 200),
    });
    Object.assign(demo, { result, state: 'done' });
    status(`${$('status').textContent}\n${result.stopped ? 'stopped' : 'done'}: ${result.steps} steps in ${result.seconds.toFixed(1)} s`);
  } catch (e) {
    fail(e);
  } finally {
    controls(false);
  }
}

$('train').onclick = train;
$('stop').onclick = () => rpc.call('stop');
$('reset').onclick = async () => {
  await rpc.call('reset', { seed: Math.floor(Math.random() * 1e6) });
  demo.losses = [];
  drawChart($('chart'), [], [], 4.5);
  status('new random weights');
};
$('generate').onclick = async () => {
  controls(true);
  try {
    const text = await rpc.call('generate', { prompt: $('prompt').value, length: 300, seed: Math.floor(Math.random() * 1e6) });
    showSample('continued from the prompt:', $('prompt').value + text);
  } catch (e) {
    fail(e);
  } finally {
    controls(false);
  }
};
checkpointButtons({
  rpc, download: $('download'), upload: $('upload'), filename: 'kiln-shakespeare-gpt.safetensors', onError: fail,
  onLoaded: (file) => {
    demo.checkpoint = { loaded: file.name, size: file.size };
    status(`loaded ${file.name} (${file.size} bytes) — press Write`);
  },
});

try {
  const info = await rpc.call('start', { device: params.get('device') || 'auto', textUrl: new URL('data/shakespeare.txt', location.href).href });
  demo.device = info;
  showDevice($('device'), info);
  drawChart($('chart'), [], [], 4.5);
  status(`ready: ${info.characters.toLocaleString('en')} characters, ${info.vocab} distinct, ${info.parameters.toLocaleString('en')} parameters · press Train`);
  controls(false);
  $('stop').disabled = true;
  demo.state = 'ready';
  window.kilnDemo.rpc = (type, args) => rpc.call(type, args);
  if (params.get('autotrain')) train();
} catch (e) {
  fail(e);
}
