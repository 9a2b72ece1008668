// Package hooktest holds what the tests of the cloud hook's packages
// share: Kubernetes objects as the tests write them, and readers of the
// events, metrics and health the hook reports.
//
// Only tests import it. It must not import package external or any of its
// subpackages, whose internal tests import it.
package hooktest
