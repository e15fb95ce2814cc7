package auth

// codeKeys spells the Redis keys of one phone's login code. They share the
// hash tag {login:PHONE}, so each script's keys sit in one cluster slot. The
// phone is validated (E.164) and the requester is a normalised address
// (requesterOf) before any key is built from them.
type codeKeys struct{ prefix string }

func (k codeKeys) tag(phone string) string { return k.prefix + ":{login:" + phone + "}" }

// Code is the current code of a phone: hash digest, tries, locked, by and
// each trusted requester's wrong tries.
func (k codeKeys) Code(phone string) string { return k.tag(phone) + ":code" }

// Resend exists while a new code may not be sent to the phone yet.
func (k codeKeys) Resend(phone string) string { return k.tag(phone) + ":resend" }

// Sent counts the codes sent to the phone in the current window for
// requesters that never logged in to it.
func (k codeKeys) Sent(phone string) string { return k.tag(phone) + ":sent" }

// SentTo counts the codes sent to the phone in the current window for one
// requester.
func (k codeKeys) SentTo(phone, requester string) string {
	return k.tag(phone) + ":sent:" + requester
}

// Total counts the codes sent to the phone in the current window for
// anyone: what PhoneCeiling bounds.
func (k codeKeys) Total(phone string) string { return k.tag(phone) + ":total" }

// Known holds the requesters that logged in to the phone lately, scored by
// the time of their last login.
func (k codeKeys) Known(phone string) string { return k.tag(phone) + ":known" }
