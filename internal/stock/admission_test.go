package stock

import (
	"testing"
	"time"
)

// TestValidateAdmission: hostile admission settings are refused
// INVALID_ARGUMENT with a reason; a good one gets the SKU's reservation
// TTL as its token TTL when it sets none.
func TestValidateAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Admission
		want Code
	}{
		{"Off", Admission{WaitlistMax: -5}, ""},
		{"OK", Admission{Mode: AdmissionTokens, WaitlistMax: 10, TokensPerCustomer: 1}, ""},
		{"UnknownMode", Admission{Mode: "ADMISSION_MODE_LOTTERY"}, CodeInvalidArgument},
		{"Draw", Admission{Mode: AdmissionDraw, DrawAt: time.Now().Add(time.Hour), WaitlistMax: 1000}, ""},
		{"DrawWithoutDrawAt", Admission{Mode: AdmissionDraw}, CodeInvalidArgument},
		{"TTLShort", Admission{Mode: AdmissionTokens, TokenTTL: time.Millisecond}, CodeInvalidArgument},
		{"TTLLong", Admission{Mode: AdmissionTokens, TokenTTL: 25 * time.Hour}, CodeInvalidArgument},
		{"WaitlistNegative", Admission{Mode: AdmissionTokens, WaitlistMax: -1}, CodeInvalidArgument},
		{"WaitlistHuge", Admission{Mode: AdmissionTokens, WaitlistMax: WaitlistMaxMax + 1}, CodeInvalidArgument},
		{"PerCustomerNegative", Admission{Mode: AdmissionTokens, TokensPerCustomer: -1}, CodeInvalidArgument},
		{"PerCustomerHuge", Admission{Mode: AdmissionTokens, TokensPerCustomer: TokensPerCustomerMax + 1}, CodeInvalidArgument},
		{"DrawAtWithoutDraw", Admission{Mode: AdmissionTokens, DrawAt: time.Now()}, CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.in
			err := ValidateAdmission(&a, time.Minute)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateAdmission(%+v) = %v, want nil", tc.in, err)
				}
				if a.On() && a.TokenTTL != time.Minute {
					t.Errorf("token TTL = %s, want the SKU's %s", a.TokenTTL, time.Minute)
				}
				return
			}
			if CodeOf(err) != tc.want {
				t.Errorf("ValidateAdmission(%+v) = %v, want %s", tc.in, err, tc.want)
			}
		})
	}
}

// TestSKU_RefuseTokenRequired: a SKU under admission refuses a plain
// reserve or deduct, and lets its own tokens through.
func TestSKU_RefuseTokenRequired(t *testing.T) {
	s := &SKU{Name: "drop", Status: StatusActive, Admission: Admission{Mode: AdmissionTokens}}
	for _, k := range []OpKind{OpReserve, OpDeduct} {
		if err := s.Refuse(&Request{Kind: k, Quantity: 1, Source: SourceAPI}, 0, time.Time{}); err == nil || err.Code != CodeTokenRequired {
			t.Errorf("Refuse(%s from the API) = %v, want TOKEN_REQUIRED", k, err)
		}
	}
	if err := s.Refuse(&Request{Kind: OpReserve, Quantity: 1, Source: SourceAdmission}, 0, time.Time{}); err != nil {
		t.Errorf("Refuse(a token's reserve) = %v, want nil", err)
	}
	if err := ValidateRequest(&Request{Kind: OpReserve, Shard: ShardKey{SKU: "drop"}, Quantity: 1, Key: TicketKey("tkt_1"), Source: SourceAPI}); CodeOf(err) != CodeInvalidIdempotencyKey {
		t.Errorf("ValidateRequest(a plain reserve with a token's key) = %v, want INVALID_IDEMPOTENCY_KEY", err)
	}
}
