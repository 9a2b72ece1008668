package portal

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// PanicError is a panic recovered while one Service was built or
// programmed: a bug that this Service's values trigger. It is confined to
// that Service, which is left out, and reported as an event on it and in
// the onehop_service_panics_total metric, so that one malformed object
// (stored by an older apiserver, say) cannot crash-loop every agent.
type PanicError struct {
	Value any    // what was passed to panic
	Where string // the function and file:line that panicked
	Stack []byte // the goroutine's stack when it panicked, for the log
}

func (e *PanicError) Error() string {
	if e.Where == "" {
		return fmt.Sprintf("panic: %v", e.Value)
	}
	return fmt.Sprintf("panic: %v (at %s)", e.Value, e.Where)
}

// Catch runs fn and returns the panic it raised, or nil when it returned.
// A caller must only use it where a panic leaves no half-done state behind,
// or undo that state itself.
func Catch(fn func()) (perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			perr = &PanicError{Value: v, Where: panicSite(), Stack: debug.Stack()}
		}
	}()
	fn()
	return nil
}

// panicSite names the frame that raised the panic being recovered: the
// first one below runtime.gopanic that is not in the runtime (an index out
// of range is raised by runtime.panicIndex on behalf of its caller).
func panicSite() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	inPanic := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			inPanic = true
		case inPanic && !strings.HasPrefix(f.Function, "runtime."):
			fn := f.Function
			if i := strings.LastIndexByte(fn, '/'); i >= 0 {
				fn = fn[i+1:]
			}
			file := f.File
			if i := strings.LastIndexByte(file, '/'); i >= 0 {
				if j := strings.LastIndexByte(file[:i], '/'); j >= 0 {
					file = file[j+1:]
				}
			}
			return fmt.Sprintf("%s %s:%d", fn, file, f.Line)
		}
		if !more {
			return ""
		}
	}
}
