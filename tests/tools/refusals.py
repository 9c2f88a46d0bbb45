"""The reference's refusals, checked in-process (a fresh interpreter per case costs seconds of torch import)."""
import contextlib
import io


def assert_refused(main, args, needle, label):
    """main(args) must exit 1 with one line on stderr, starting 'error:' and containing needle."""
    buf, code = io.StringIO(), None
    with contextlib.redirect_stderr(buf):
        try:
            main(args)
        except SystemExit as e:
            code = e.code
    err = buf.getvalue().strip()
    assert code == 1 and err.startswith("error:") and "\n" not in err and needle in err, \
        "%s: exit %r, stderr %r" % (label, code, err[-300:])
