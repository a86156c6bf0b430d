"""dict-engine: a second serving engine for the toy models, written from docs/engine-contract.md
and docs/toy.md alone (standard library only; nothing of this project is imported).

Its prefix cache is deliberately unlike a paged KV cache: a plain dict from a prefix (a tuple of
token ids) to the toy's running state after that prefix: (S, C), or for toy-attn the read O and
the five running sums (docs/engine-contract.md, "Computing toy-attn"). Every position of every
sequence served (prompt and answer) is kept for the paged toys; the lined toy keeps only each
sequence's end, as a recurrent-state engine does. Sequences are evicted least recently served first
once more than `--keep` are held, or once the states held exceed `--cache-tokens` (one state a token:
the gate's ``{cache_tokens}``; a lined state counts the tokens it stands for; 0, the default, bounds
nothing). A request resumes from the longest cached prefix of at most len(prompt) - 1 tokens (the
last prompt token is always recomputed), feeds the rest, then decodes greedily.

    python tests/engines/dict_engine.py --port 8000 [--model toy-paged | --manifest PATH] [--keep 64]
        [--cache-tokens N] [--lack CAP ...] [--bug short-key|off-by-one|stale-evict|race|cached-lie|stream-drop-last]

`--bug` plants one realistic prefix-cache bug (off by default) that the gate must catch. `--manifest`
(the gate's `{manifest}`) names the toy by its manifest: its model name and family are read from it.
It computes the paged, the lined and the attn family (`facts.families`); started for a toy of another family it
still answers /health and /kern/capabilities, and refuses every completion. `--reset` serves
`POST /reset_prefix_cache` (the cache emptied) and declares it (`facts.reset`), for `e2e --engine-url`.
"""

import argparse
import codecs
import json
import signal
import threading
import time
from collections import OrderedDict
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MASK = (1 << 64) - 1
EOS = 256
MAX_LEN = 8192
CAPABILITIES = ("text", "cached-tokens", "stream")
BUGS = ("short-key", "off-by-one", "stale-evict", "race", "cached-lie", "stream-drop-last")
MODELS = {"toy-paged": "paged", "toy-spec": "paged", "toy-big": "paged", "toy-stateful": "lined",
          "toy-stateful-spec": "lined", "toy-attn": "attn"}
"""The toys this engine knows by name (and their -ref twins), and each one's family."""
FAMILIES = ("paged", "lined", "attn")
"""The toy families it computes (docs/toy.md): paged (next_of(S)), lined (next_of(S + C)) or attn
(next_of(splitmix(O)))."""
RESET = {True: {"reset": "/reset_prefix_cache"}}
"""--reset: the fact that declares its cache reset (docs/engine-contract.md)."""


def family_of(manifest):
    """A manifest's toy family, as docs/toy.md tells them apart."""
    states = manifest.get("states") or {}
    if isinstance(manifest.get("family"), str):
        return manifest["family"]
    if "logits" in (manifest.get("buffers") or {}):
        return "float"
    if "kv.0" in states:
        return "layered"
    if "attn" in states:
        return "attn"
    return "lined" if any((s or {}).get("bytes_per_seq", 0) for s in states.values()) else "paged"


# -- the toy's arithmetic (docs/toy.md) ----------------------------------------------------------

def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


SALT = [splitmix(0x7071 + i) >> 1 for i in range(64)]


def rotl(x, k):
    k &= 63
    return ((x << k) | (x >> (64 - k))) & MASK if k else x


def mark(t, p, w):
    return splitmix((t * 0x100000001B3) & MASK ^ (p * 0x9E3779B1) & MASK ^ (w * 0xC2B2AE35) & MASK ^ SALT[w & 63])


@lru_cache(maxsize=1 << 18)
def slot_sum(t, p):
    """What the token slot (t, p) adds to the sequence sum S: its 64 head words rotated by p."""
    return sum(rotl(mark(t, p, w), p) for w in range(64)) & MASK


def slot(t, p):
    """What feeding token t at position p contributes: (slot_sum, the carry's mark)."""
    return slot_sum(t, p), mark(t, p, 0)


def add(state, contribution, lined):
    """The state (S, C) after a token whose contribution is `contribution`."""
    s, c = state
    return (s + contribution[0]) & MASK, (rotl(c, 7) ^ contribution[1]) if lined else 0


def next_of(x):
    return EOS if (x >> 56) % 96 == 0 else x % 256


def predict(state):
    """The greedy next token: next_of(S + C) (C is 0 for the paged toy)."""
    return next_of((state[0] + state[1]) & MASK)


# -- toy-attn: the state is (O, key sums, value sums of buckets 0..3) ---------------------------

ATTN_EMPTY = (0,) * 6


def attn_read(ks, vb, query):
    return (ks + sum(vb) + 2 * vb[query >> 62]) & MASK


def attn_feed(state, t, p):
    """The state after token t at position p: its entry (K, V) is written from the read of every
    earlier one, then added to the sums; O is the read that includes it."""
    _, ks, *vb = state
    query = mark(t, p, 16)
    r = attn_read(ks, vb, query)
    k = [splitmix(mark(t, p, w) ^ rotl(r, w)) for w in range(8)]
    v = [splitmix(mark(t, p, 8 + w) ^ rotl(r, 8 + w)) for w in range(8)]
    ks = (ks + sum(rotl(x, p) for x in k)) & MASK
    vb[k[0] >> 62] = (vb[k[0] >> 62] + sum(rotl(x, p + 32) for x in v)) & MASK
    return (attn_read(ks, vb, query), ks, *vb)


def attn_predict(state):
    return next_of(splitmix(state[0]))


# -- the prefix cache ----------------------------------------------------------------------------

class PrefixCache:
    """prefix tuple -> (S, C), held per sequence with LRU eviction by sequence; one lock."""

    def __init__(self, keep, lined, bug, empty=(0, 0), tokens=0):
        self.keep, self.lined, self.bug, self.empty, self.tokens = keep, lined, bug, empty, tokens
        self.states = {}                 # key -> (S, C)
        self.refs = {}                   # key -> how many held sequences hold it
        self.sequences = OrderedDict()   # sequence number -> its keys, oldest first
        self.next_seq = 0
        self.lock = threading.Lock()

    def key(self, prefix):
        return tuple(prefix[-16:]) if self.bug == "short-key" else tuple(prefix)

    def lookup(self, prompt):
        """(k, state) for the longest cached prefix of at most len(prompt) - 1 tokens; (0, empty) if none."""
        with self.lock:
            for k in range(len(prompt) - 1, 0, -1):
                state = self.states.get(self.key(prompt[:k]))
                if state is not None:
                    return k, state
        return 0, self.empty

    def store(self, tokens, computed):
        """Hold a served sequence: computed[n] is the state after tokens[:n], for the positions this
        request fed; the prefixes it resumed from are held too, where still cached."""
        ends = [len(tokens)] if self.lined else range(1, len(tokens) + 1)
        with self.lock:
            keys = []
            for n in ends:
                key = self.key(tokens[:n])
                if n in computed:
                    self.states[key] = computed[n]
                elif key not in self.states:
                    continue
                self.refs[key] = self.refs.get(key, 0) + 1
                keys.append(key)
            self.sequences[self.next_seq] = keys
            self.next_seq += 1
            while len(self.sequences) > self.keep or (self.tokens and self.held() > self.tokens
                                                      and len(self.sequences) > 1):
                self.evict()

    def held(self):
        """Tokens held: a state a token (paged); a lined state stands for every token of its key."""
        return sum(map(len, self.states)) if self.lined else len(self.states)

    def evict(self):
        """Drop the least recently served sequence (the lock is held)."""
        _, keys = self.sequences.popitem(last=False)
        if self.bug == "stale-evict":  # states kept, the last one "restored" from the first
            self.states[keys[-1]] = self.states.get(keys[0], self.empty)
            return
        for key in keys:
            self.refs[key] -= 1
            if self.refs[key] == 0:
                del self.refs[key], self.states[key]

    def clear(self):
        """Forget every cached prefix (`POST /reset_prefix_cache` under --reset)."""
        with self.lock:
            self.states.clear()
            self.refs.clear()
            self.sequences.clear()


# -- the engine ----------------------------------------------------------------------------------

class Engine:
    """Serves one request at a time per thread; the cache is the only thing requests share
    (except under --bug race)."""

    def __init__(self, model, keep, lack, bug, family, tokens=0):
        self.model, self.bug = model, bug
        self.family = family if family in FAMILIES else None  # None: a family it does not compute (refused)
        self.lined = self.family == "lined"
        self.empty = ATTN_EMPTY if self.family == "attn" else (0, 0)
        self.predict = attn_predict if self.family == "attn" else predict
        self.capabilities = [c for c in CAPABILITIES if c not in lack]
        self.cache = PrefixCache(keep, self.lined, bug, self.empty, tokens)
        self.in_flight = 0
        self.flight_lock = threading.Lock()
        self.shared = [self.empty]       # --bug race: one engine-wide running state

    def feed(self, box, t, p):
        """Feed token t at position p into the running state box[0]."""
        if self.family == "attn":
            box[0] = attn_feed(box[0], t, p)
            return
        x = slot(t, p)  # the slot first, then added to the running state (a thread switch lands in
        # the slot's arithmetic, so under --bug race another request's state is what it is added to)
        box[0] = add(box[0], x, self.lined)

    def generate(self, prompt, max_tokens):
        """Yield (token, cached) for each generated token, the last EOS when it stops; then store."""
        with self.flight_lock:
            self.in_flight += 1
        try:
            cached, state = self.cache.lookup(prompt)
            start = cached
            if self.bug == "off-by-one" and cached:
                start = cached - 1        # token k-1 is fed again on top of a state that holds it
            tokens, computed = list(prompt[:cached]), {}
            box = self.shared if self.bug == "race" and self.in_flight > 1 else [state]
            box[0] = state
            for p in range(start, len(prompt)):
                self.feed(box, prompt[p], p)
                if p >= cached:
                    tokens.append(prompt[p])
                    computed[len(tokens)] = box[0]
            for _ in range(max_tokens):
                t = self.predict(box[0])
                self.feed(box, t, len(tokens))
                tokens.append(t)
                computed[len(tokens)] = box[0]
                yield t, cached
                if t == EOS:
                    break
            self.cache.store(tokens, computed)
        finally:
            with self.flight_lock:
                self.in_flight -= 1


class BadRequest(ValueError):
    def __init__(self, message, param=None, status=400):
        super().__init__(message)
        self.param, self.status = param, status


def parse_completion(body, engine):
    """(prompt ids, max_tokens, stream, return_token_ids) from a /v1/completions body, or BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model")
    if model is not None and model != engine.model:
        raise BadRequest(f"The model `{model}` does not exist.", "model", 404)
    if engine.family is None:
        raise BadRequest(f"this engine computes only the {', '.join(FAMILIES)} toys, not `{engine.model}`", "model", 404)
    prompt = body.get("prompt")
    if isinstance(prompt, str) and "text" in engine.capabilities:
        prompt = list(prompt.encode("utf-8"))
    if not isinstance(prompt, list) or not all(type(t) is int and 0 <= t <= EOS for t in prompt):
        want = "a string or a list of token ids" if "text" in engine.capabilities else "a list of token ids"
        raise BadRequest(f"'prompt' must be {want} (ids 0..{EOS})", "prompt")
    if not prompt:
        raise BadRequest("'prompt' is empty", "prompt")
    max_tokens = body.get("max_tokens", 16)
    if type(max_tokens) is not int or max_tokens < 1:
        raise BadRequest("'max_tokens' must be an integer >= 1", "max_tokens")
    if len(prompt) + max_tokens > MAX_LEN:
        raise BadRequest(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds {MAX_LEN}", "max_tokens")
    temperature = body.get("temperature")
    if temperature not in (None, 0, 0.0) or isinstance(temperature, bool):
        raise BadRequest("'temperature' must be 0: this engine decodes greedily", "temperature")
    for flag in ("stream", "return_token_ids"):
        if body.get(flag) is not None and not isinstance(body.get(flag), bool):
            raise BadRequest(f"'{flag}' must be a boolean", flag)
    stream = bool(body.get("stream"))
    if stream and "stream" not in engine.capabilities:
        raise BadRequest("streaming is not served by this engine", "stream")
    return prompt, max_tokens, stream, bool(body.get("return_token_ids"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine = None
    started = 0.0
    reset = False  # --reset: POST /reset_prefix_cache empties the cache, declared as facts.reset

    def log_message(self, fmt, *args):  # quiet: the gate keeps the server's log, requests need no line
        pass

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, message, param=None):
        self.send_json(status, {"error": {"message": message, "type": "BadRequestError" if status == 400
                                          else "NotFoundError", "param": param, "code": status}})

    def do_GET(self):
        e = self.engine
        if self.path == "/health":
            ready = time.monotonic() - self.started >= 0.3
            self.send_json(200 if ready else 503, {} if ready else {"error": "loading"})
        elif self.path == "/kern/capabilities":
            self.send_json(200, {"contract": 1, "engine": {"name": "dict-engine", "version": "1"},
                                 "capabilities": e.capabilities, "facts": {"page": 1, "families": list(FAMILIES),
                                                                           **RESET.get(self.reset, {})}})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": e.model, "object": "model",
                                                             "owned_by": "dict-engine", "max_model_len": MAX_LEN}]})
        elif self.path == "/version":
            self.send_json(200, {"version": "1"})
        else:
            self.error(404, f"no such route: GET {self.path}")

    def read_body(self):
        try:
            length = int(self.headers.get("Content-Length", ""))
            return json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None

    def do_POST(self):
        try:
            if self.path == "/v1/completions":
                self.complete(self.read_body())
            elif self.path == "/reset_prefix_cache" and self.reset:
                self.engine.cache.clear()
                print("dict-engine: prefix cache reset", flush=True)
                self.send_json(200, {})
            elif self.path == "/tokenize" and "text" in self.engine.capabilities:
                body = self.read_body()
                if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
                    raise BadRequest("'prompt' must be a string", "prompt")
                ids = list(body["prompt"].encode("utf-8"))
                self.send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": MAX_LEN})
            else:
                self.error(404, f"no such route: POST {self.path}")
        except BadRequest as exc:
            self.error(exc.status, str(exc), exc.param)
        except ConnectionError:  # the client hung up: nothing to answer
            self.close_connection = True

    def complete(self, body):
        e = self.engine
        prompt, max_tokens, stream, return_ids = parse_completion(body, e)
        head = {"id": f"cmpl-{id(self):x}", "object": "text_completion", "created": int(time.time()), "model": e.model}
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        ids, cached = [], 0
        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
        for t, cached in e.generate(prompt, max_tokens):
            ids.append(t)
            if stream:
                last = t == EOS or len(ids) == max_tokens
                choice = {"index": 0, "text": self.text(decoder, t, last), "finish_reason": None}
                if return_ids:  # --bug stream-drop-last: the final chunk carries its finish reason, not its token
                    choice["token_ids"] = [] if last and e.bug == "stream-drop-last" else [t]
                chunk = dict(head, choices=[choice])
                if last:
                    choice["finish_reason"] = "stop" if t == EOS else "length"
                    chunk["usage"] = self.usage(e, prompt, ids, cached)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
        if stream:
            self.wfile.write(b"data: [DONE]\n\n")
            return
        choice = {"index": 0, "text": "".join(self.text(decoder, t, i == len(ids) - 1) for i, t in enumerate(ids)),
                  "finish_reason": "stop" if ids[-1] == EOS else "length"}
        if return_ids:
            choice["token_ids"], choice["prompt_token_ids"] = ids, prompt
        self.send_json(200, dict(head, choices=[choice], usage=self.usage(e, prompt, ids, cached)))

    @staticmethod
    def text(decoder, t, final):
        """The characters token t completes (EOS has none); bytes are UTF-8, decoded incrementally."""
        return decoder.decode(bytes([t]) if t < 256 else b"", final)

    @staticmethod
    def usage(e, prompt, ids, cached):
        told = len(prompt) if e.bug == "cached-lie" else cached
        out = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        if "cached-tokens" in e.capabilities:
            out["prompt_tokens_details"] = {"cached_tokens": told}
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reset", action="store_true", help="serve POST /reset_prefix_cache (declared: facts.reset)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", default=None, help=f"one of {', '.join(MODELS)} (or a -ref twin); default toy-paged")
    ap.add_argument("--manifest", default=None, help="the toy's manifest (JSON): its model name and family")
    ap.add_argument("--keep", type=int, default=64, help="sequences held in the prefix cache")
    ap.add_argument("--cache-tokens", type=int, default=0, help="states (tokens) held at most; 0: no bound")
    ap.add_argument("--lack", nargs="*", default=[], choices=CAPABILITIES, help="capabilities not to declare")
    ap.add_argument("--bug", choices=BUGS, help="plant a prefix-cache bug")
    args = ap.parse_args()
    if args.manifest is not None:
        try:
            with open(args.manifest) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as exc:
            ap.error(f"--manifest {args.manifest}: {exc}")
        args.model = args.model or str(manifest.get("model"))
        family = family_of(manifest)
    else:
        args.model = args.model or "toy-paged"
        family = MODELS.get(args.model.removesuffix("-ref"))
    if args.cache_tokens < 0:
        ap.error(f"--cache-tokens {args.cache_tokens}: must be 0 (no bound) or more")
    Handler.engine = Engine(args.model, max(args.keep, 1), set(args.lack), args.bug, family, args.cache_tokens)
    Handler.started = time.monotonic()
    Handler.reset = args.reset
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    stop = lambda *_: threading.Thread(target=server.shutdown).start()  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"dict-engine serving {args.model} on http://{args.host}:{args.port} (keep {args.keep}, bug {args.bug})",
          flush=True)
    server.serve_forever(poll_interval=0.05)  # a SIGTERM ends it within 50 ms
    server.server_close()


if __name__ == "__main__":
    main()
