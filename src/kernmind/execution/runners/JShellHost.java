// kernmind's warm JShell host: one JVM that runs snippets for one sandboxed workspace.
//
// Protocol. Requests on stdin: a decimal byte length on its own line, then that many bytes
// of UTF-8 code. Replies on stdout as frames: MAGIC, one type byte, a 4-byte big-endian
// length, the payload. 'O'/'E' carry the snippet's stdout/stderr bytes as they are written,
// 'R' ends a request with a small JSON object, 'H' says the host is ready. Anything on
// stdout outside a frame (a JVM warning, code writing to FileDescriptor.out) is passed on
// by the reader as plain stdout.
//
// Isolation between calls: every request runs in a brand-new JShell instance (a fresh
// class loader, so no variables, methods or classes survive); System.out/err/in, system
// properties, default locale and time zone are restored after each call. When a call
// leaves threads running, the reply says "dirty" and the caller retires this JVM.
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import jdk.jshell.*;
import jdk.jshell.SourceCodeAnalysis.Completeness;

public class JShellHost {
    static final byte[] MAGIC = {0, 'K', 'M', 'F'};
    static final OutputStream RAW = new FileOutputStream(FileDescriptor.out);

    static synchronized void frame(char type, byte[] data, int off, int len) {
        try {
            RAW.write(MAGIC);
            RAW.write((byte) type);
            RAW.write(new byte[] {(byte) (len >>> 24), (byte) (len >>> 16), (byte) (len >>> 8), (byte) len});
            RAW.write(data, off, len);
            RAW.flush();
        } catch (IOException e) {
            System.exit(3);
        }
    }

    static final class FrameStream extends OutputStream {
        final char type;
        final byte[] buf = new byte[8192];
        int n = 0;

        FrameStream(char type) { this.type = type; }

        @Override public synchronized void write(int b) {
            if (n == buf.length) flush();
            buf[n++] = (byte) b;
        }

        @Override public synchronized void write(byte[] b, int off, int len) {
            if (len > buf.length - n) flush();
            if (len >= buf.length) { frame(type, b, off, len); return; }
            System.arraycopy(b, off, buf, n, len);
            n += len;
        }

        @Override public synchronized void flush() {
            if (n > 0) { frame(type, buf, 0, n); n = 0; }
        }
    }

    static final FrameStream OUT_FRAMES = new FrameStream('O');
    static final FrameStream ERR_FRAMES = new FrameStream('E');
    static final PrintStream OUT = new PrintStream(OUT_FRAMES, true, StandardCharsets.UTF_8);
    static final PrintStream ERR = new PrintStream(ERR_FRAMES, true, StandardCharsets.UTF_8);
    static final InputStream EMPTY_IN = new ByteArrayInputStream(new byte[0]);

    static String json(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static JShell newShell() {
        return JShell.builder()
                .executionEngine("local")
                .out(OUT)
                .err(ERR)
                .in(EMPTY_IN)
                .build();
    }

    static String describe(JShell js, Snippet sn, String source) {
        StringBuilder b = new StringBuilder();
        js.diagnostics(sn).forEach(d -> {
            if (!d.isError()) return;
            long pos = d.getStartPosition();
            String where = "";
            if (pos >= 0 && pos <= source.length()) {
                String before = source.substring(0, (int) pos);
                int line = before.split("\n", -1).length;
                where = "line " + line + ": ";
            }
            if (b.length() > 0) b.append('\n');
            b.append(where).append(d.getMessage(Locale.ROOT));
        });
        return b.toString();
    }

    static String stackTrace(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    /** Run one request; return the JSON reply. */
    static String run(JShell js, String code) {
        String remaining = code;
        String value = null;
        int lineOffset = 0;
        while (remaining != null && !remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = js.sourceCodeAnalysis().analyzeCompletion(remaining);
            Completeness c = ci.completeness();
            String src = ci.source();
            String rest = ci.remaining();
            if (c == Completeness.DEFINITELY_INCOMPLETE || c == Completeness.CONSIDERED_INCOMPLETE
                    || src == null || src.isBlank()) {
                return "{\"status\":\"error\",\"name\":\"SyntaxError\",\"value\":"
                        + json("incomplete input at the end of the code: " + firstLine(remaining)) + "}";
            }
            value = null;
            List<SnippetEvent> events = js.eval(src);
            for (SnippetEvent ev : events) {
                if (ev.causeSnippet() != null) continue;
                Snippet sn = ev.snippet();
                if (ev.status() == Snippet.Status.REJECTED) {
                    String msg = describe(js, sn, src);
                    String name = c == Completeness.UNKNOWN ? "SyntaxError" : "CompilationError";
                    return "{\"status\":\"error\",\"name\":\"" + name + "\",\"value\":" + json(msg)
                            + ",\"traceback\":" + json(msg + "\n  in: " + src.strip()) + "}";
                }
                if (ev.status() == Snippet.Status.RECOVERABLE_NOT_DEFINED
                        || ev.status() == Snippet.Status.RECOVERABLE_DEFINED) {
                    if (sn instanceof DeclarationSnippet) {
                        List<String> unresolved = js.unresolvedDependencies((DeclarationSnippet) sn).toList();
                        if (!unresolved.isEmpty() && ev.status() == Snippet.Status.RECOVERABLE_NOT_DEFINED) {
                            String msg = "cannot find symbol: " + String.join(", ", unresolved);
                            return "{\"status\":\"error\",\"name\":\"CompilationError\",\"value\":" + json(msg)
                                    + ",\"traceback\":" + json(msg + "\n  in: " + src.strip()) + "}";
                        }
                    }
                }
                JShellException ex = ev.exception();
                if (ex != null) {
                    String name;
                    String message = ex.getMessage();
                    if (ex instanceof EvalException) {
                        name = ((EvalException) ex).getExceptionClassName();
                    } else if (ex instanceof UnresolvedReferenceException) {
                        name = "UnresolvedReferenceException";
                        message = "unresolved reference in " + ((UnresolvedReferenceException) ex).getSnippet().source().strip();
                    } else {
                        name = ex.getClass().getName();
                    }
                    String tb = name + (message != null ? ": " + message : "") + "\n" + stackTrace(ex)
                            .lines().skip(1).filter(l -> !l.contains("jdk.jshell") && !l.contains("JShellHost")
                                    && !l.contains("java.base/jdk.internal.reflect") && !l.contains("java.lang.reflect.Method"))
                            .reduce("", (a, l) -> a + l + "\n");
                    return "{\"status\":\"error\",\"name\":" + json(name) + ",\"value\":" + json(message == null ? "" : message)
                            + ",\"traceback\":" + json(tb) + "}";
                }
                String sub = sn.subKind().name();
                if (sn.kind() == Snippet.Kind.EXPRESSION || sub.equals("TEMP_VAR_EXPRESSION_SUBKIND")) {
                    value = ev.value();
                }
            }
            remaining = rest;
        }
        return "{\"status\":\"ok\",\"value\":" + json(value) + "}";
    }

    static String firstLine(String s) {
        String t = s.strip();
        int nl = t.indexOf('\n');
        return nl < 0 ? t : t.substring(0, nl) + " …";
    }

    static String readRequest(BufferedInputStream in) throws IOException {
        StringBuilder len = new StringBuilder();
        int b;
        while ((b = in.read()) != '\n') {
            if (b < 0) return null;
            len.append((char) b);
        }
        int n = Integer.parseInt(len.toString().trim());
        byte[] data = in.readNBytes(n);
        if (data.length < n) return null;
        return new String(data, StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        BufferedInputStream in = new BufferedInputStream(new FileInputStream(FileDescriptor.in));
        Properties props = (Properties) System.getProperties().clone();
        Locale locale = Locale.getDefault();
        TimeZone zone = TimeZone.getDefault();
        Set<Thread> baseline = new HashSet<>(Thread.getAllStackTraces().keySet());
        System.setOut(OUT);
        System.setErr(ERR);
        System.setIn(EMPTY_IN);
        // Warm the compiler and the execution path once, so the first real call is fast.
        JShell warm = newShell();
        warm.eval("int $warm = 1 + 1;");
        warm.eval("String.valueOf($warm).length()");
        warm.close();
        baseline.addAll(Thread.getAllStackTraces().keySet());
        JShell js = newShell();
        frame('H', new byte[0], 0, 0);
        while (true) {
            String code = readRequest(in);
            if (code == null) break;
            String reply;
            try {
                reply = run(js, code);
            } catch (Throwable t) {
                reply = "{\"status\":\"error\",\"name\":" + json(t.getClass().getName()) + ",\"value\":"
                        + json(String.valueOf(t.getMessage())) + ",\"traceback\":" + json(stackTrace(t)) + "}";
            }
            System.out.flush();
            System.err.flush();
            OUT_FRAMES.flush();
            ERR_FRAMES.flush();
            try { js.close(); } catch (Throwable ignored) { }
            // Restore what a snippet may have changed in the JVM.
            System.setOut(OUT);
            System.setErr(ERR);
            System.setIn(EMPTY_IN);
            System.setProperties((Properties) props.clone());
            Locale.setDefault(locale);
            TimeZone.setDefault(zone);
            boolean dirty = false;
            for (Thread t : Thread.getAllStackTraces().keySet()) {
                if (!baseline.contains(t) && t.isAlive() && !t.isDaemon()) dirty = true;
            }
            if (dirty) reply = reply.substring(0, reply.length() - 1) + ",\"dirty\":true}";
            byte[] r = reply.getBytes(StandardCharsets.UTF_8);
            frame('R', r, 0, r.length);
            if (dirty) break;
            js = newShell();
        }
        System.exit(0);
    }
}
