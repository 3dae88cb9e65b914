/* judge_answer: an answer got without an attempt of ours (a Batch API's
 * result line), judged by the core as it judges an attempt's: an error's
 * message screened for the request's texts and credentials, a 200 whose
 * body is an error or holds no answer refused, usage and models read, the
 * package's Result built as for a call. The policy stays in the core: the
 * answer is the one exchange of a call on an engine whose host moves no
 * bytes (io_loop host, llmretry_call_exchange_answer). */
#include "binding.h"

#include <string.h>

/* A host engine of its own for each answer: what one answer teaches an
 * endpoint (a 429 slows it down for every call) must not delay or change
 * how the next line is judged. One costs ~15 us to make and free. */
static llmretry_call *judge(call_args *a, int status, const char *answer, size_t len,
                            llmretry_status *st, char *err, size_t errlen)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.io_loop = LLMRETRY_IO_LOOP_HOST;
    llmretry_engine *e = NULL;
    *st = llmretry_engine_new(&eo, &e, err, errlen);
    if (*st != LLMRETRY_OK)
        return NULL;
    llmretry_call *c = NULL;
    *st = llmretry_engine_submit(e, &a->o, 0, &c, err, errlen);
    if (*st == LLMRETRY_OK) {
        llmretry_exchange x;
        llmretry_engine_run(e, NULL);
        if (llmretry_call_exchange(c, &x))
            llmretry_call_exchange_answer(c, x.token, status, answer, len);
        llmretry_engine_run(e, NULL);
    }
    /* Freeing the engine ends a call still waiting (none can: one attempt,
     * no validator) as cancelled: its result is there either way. */
    llmretry_engine_free(e);
    if (c) {
        llmretry_event *ev;
        while (llmretry_call_next(c, &ev) == LLMRETRY_MAIL_EVENT)
            llmretry_event_free(ev);
    }
    return c;
}

PyObject *lr_py_judge_answer(PyObject *module, PyObject *args, PyObject *kw)
{
    int status;
    Py_buffer answer;
    PyObject *body;
    if (!PyArg_ParseTuple(args, "iy*O:judge_answer", &status, &answer, &body))
        return NULL;
    PyObject *rest = PyTuple_Pack(1, body);
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event, *validate;
    int rc = rest ? parse_call_args(rest, kw, &a, &on_event, &validate) : -1;
    Py_XDECREF(rest);
    if (rc == 0 && (on_event != Py_None || validate != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "judge_answer(): on_event and validate are not for "
                        "an answer judged here");
        rc = -1;
    }
    llmretry_call *c = NULL;
    if (rc == 0) {
        llmretry_status st = LLMRETRY_OK;
        char err[LLMRETRY_ERRBUF] = "";
        a.o.max_retries = 0;        /* one answer: one attempt */
        c = judge(&a, status, answer.buf, (size_t)answer.len, &st, err, sizeof err);
        if (!c)
            PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError
                            : st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
    }
    call_args_release(&a);
    PyBuffer_Release(&answer);
    if (!c)
        return NULL;
    PyObject *v = call_value(lr_py_state_of(module), llmretry_call_result(c), Py_None, 1);
    llmretry_call_free(c);
    return v;
}
