// Package config turns the configuration file's external section (Config,
// Decode) and the onehop.io custom resources (package
// external/api/v1alpha1; Watch, Convert) into one typed configuration
// (Parsed) that the controller and every agent compute alike: each object
// is checked alone and with the older ones, and an invalid object keeps
// its last accepted version in force. ForNode picks one node's part, and
// the holder of the allocator Lease writes each object's status
// (Watch.WriteStatus) and, in a split install, publishes the BGP
// passwords for the node agents (Watch.PublishPasswords).
//
// It also says what the advertisements let each node announce
// (Announcer). Putting a new configuration in force (restarting the
// providers it changes) is the hook's.
//
// It must not import package external or any of its subpackages other
// than api/v1alpha1, bgp, ipam, l2 and webhook: the rest build on it.
package config
