#!/usr/bin/env python3
"""A stand-in for the app next to leaderd, for the app check tests.

    python3 app.py PORT_FILE STATE_FILE

Listens on a free port of 127.0.0.1 and writes the port to PORT_FILE. Every
GET reads STATE_FILE: "ok" answers 200, "hang" never answers (the connection
stays open), anything else (or no file) answers 503. Exits when PORT_FILE's
directory is removed (the test's temporary directory).
"""

import http.server
import os
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            with open(STATE_FILE) as f:
                state = f.read().strip()
        except OSError:
            state = "missing"
        if state == "hang":
            while os.path.exists(os.path.dirname(PORT_FILE)):
                time.sleep(0.2)
            return
        code = 200 if state == "ok" else 503
        body = state.encode()
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def watchdog():
    while os.path.exists(os.path.dirname(PORT_FILE)):
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    PORT_FILE, STATE_FILE = sys.argv[1], sys.argv[2]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = PORT_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, PORT_FILE)
    threading.Thread(target=watchdog, daemon=True).start()
    server.serve_forever()
