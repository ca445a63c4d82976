package messages_test

import (
	"fmt"
	"reflect"
)

// diff returns "" when want and got are deeply equal, else both, one per
// line. (The contract module depends on msgpack alone, tests included, so
// that producers importing it pull nothing else: no go-cmp here.)
func diff(want, got any) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	return fmt.Sprintf("-want: %s\n+got:  %s", show(want), show(got))
}

// diffEmptyEqual is diff with nil and empty slices equal.
func diffEmptyEqual[T any](want, got []T) string {
	if len(want) == 0 && len(got) == 0 {
		return ""
	}
	return diff(want, got)
}

// show prints v with field names, following pointers at the top.
func show(v any) string {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		return "&" + fmt.Sprintf("%+v", rv.Elem().Interface())
	}
	return fmt.Sprintf("%+v", v)
}
